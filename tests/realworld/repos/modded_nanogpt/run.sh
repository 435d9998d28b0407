# copied from KellerJordan/modded-nanogpt@f411b3d346aa52d3504324ca93c230fd84c6c07f: run.sh
torchrun --standalone --nproc_per_node=8 train_gpt.py
