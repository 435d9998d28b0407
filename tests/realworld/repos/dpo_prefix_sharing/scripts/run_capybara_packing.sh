# copied from frankxwang/dpo-prefix-sharing@8963fa984a894ea19dad0309ed424d0921606b50: scripts/run_capybara_packing.sh
dataset="argilla/distilabel-capybara-dpo-7k-binarized" 
model="meta-llama/Meta-Llama-3.1-8B-Instruct"
max_length=2842
max_prompt_length=2180
packing_length=3968
batch_size=2
output_dir="capybara_packing"

accelerate launch --config_file 'configs/zero3.yaml' train_dpo.py \
  --dataset_name=$dataset \
  --model_name_or_path=$model \
  --per_device_train_batch_size 1 \
  --per_device_eval_batch_size 1 \
  --beta 0.1 \
  --learning_rate 1e-6 \
  --gradient_accumulation_steps 1 \
  --logging_steps 10 \
  --warmup_ratio 0.1 \
  --bf16 \
  --logging_first_step \
  --no_remove_unused_columns \
  --output_dir $output_dir \
  --max_prompt_length $max_prompt_length \
  --max_length $max_length \
  --gradient_checkpointing True \
  --save_strategy no \
  --dataset_train_split train \
  --num_train_epochs 1 \
  --dataloader_num_workers 4 \
  --dataset_num_proc 8 \
  --attn_implementation flex_attention \
  --prefix_sharing \
  --enable_packing \
  --packing_length $((packing_length*batch_size))
