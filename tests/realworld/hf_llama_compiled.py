"""Real-code case: a whole HF Llama (transformers, pip-installed; tiny, random weights) with
attn_implementation="flex_attention", compiled as a model: `--backend aot_eager` is the faulty case
(every layer runs flex dense, and a compiled flex wrapper would not help), `--backend inductor` its
healthy twin. `--grow` feeds a growing sequence length, `--static` compiles with dynamic=False: with
both, every length is a new graph until dynamo's recompile limit (lowered here to 3 to keep the case
short; training code has 8 or more) makes it run eagerly, and flex dense.
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="inductor")
parser.add_argument("--static", action="store_true")
parser.add_argument("--grow", action="store_true")
args = parser.parse_args()

torch._dynamo.config.recompile_limit = 3
config = LlamaConfig(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=256,
)
model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention").eval()
if args.static:
    model = torch.compile(model, backend=args.backend, dynamic=False)
else:
    model = torch.compile(model, backend=args.backend)
lengths = [16 + 8 * i for i in range(5)] if args.grow else [32, 32]
with torch.no_grad():  # flex_attention has no CPU backward
    for length in lengths:
        model(input_ids=torch.randint(0, 256, (1, length)))
