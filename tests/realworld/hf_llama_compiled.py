"""Real-code case: a whole HF Llama (transformers, pip-installed; tiny, random weights) with
attn_implementation="flex_attention", compiled as a model: `--backend aot_eager` is the faulty case
(every layer runs flex dense, and a compiled flex wrapper would not help), `--backend inductor` its
healthy twin. `--grow` feeds a growing sequence length, `--static` compiles with dynamic=False: with
both, every length is a new graph until dynamo's recompile limit (lowered here to 3 to keep the case
short; training code has 8 or more) makes it run eagerly, and flex dense. On a GPU, `--device cuda
--train --seq 4096 --layers 4` runs forward and backward at a training shape (bf16).
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="inductor")
parser.add_argument("--static", action="store_true")
parser.add_argument("--grow", action="store_true")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--seq", type=int, default=32)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--lengths", type=int, default=5, help="lengths fed with --grow")
args = parser.parse_args()

torch._dynamo.config.recompile_limit = 3
gpu = args.device == "cuda"
config = LlamaConfig(
    hidden_size=1024 if gpu else 64,
    num_hidden_layers=args.layers,
    num_attention_heads=8 if gpu else 4,
    num_key_value_heads=2,
    head_dim=128 if gpu else 16,
    intermediate_size=2048 if gpu else 128,
    vocab_size=1024 if gpu else 256,
)
dtype = torch.bfloat16 if gpu else torch.float32
model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention", dtype=dtype).to(args.device)
model.train(args.train)
if args.static:
    model = torch.compile(model, backend=args.backend, dynamic=False)
else:
    model = torch.compile(model, backend=args.backend)
lengths = [args.seq // 2 + 8 * i for i in range(args.lengths)] if args.grow else [args.seq] * args.steps
with torch.set_grad_enabled(args.train):
    for length in lengths:
        ids = torch.randint(0, config.vocab_size, (1, length), device=args.device)
        out = model(input_ids=ids, labels=ids if args.train else None)
        if args.train:
            out.loss.backward()
