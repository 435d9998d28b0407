"""Real-code case: a tiny Qwen3.5 hybrid text model (transformers 5.24's `Qwen3_5TextConfig`,
pip-installed; random weights, the widths of the `qwen27b` preset at tiny scale) built by a
training-style script: three gated-DeltaNet linear-attention layers and one full-attention layer,
as in Qwen3.5/3.6, where every fourth layer is full attention.

What it reproduces (issue 29, item 6): traced with `trace-attention --script`, only the
full-attention layer was listed (the gated-DeltaNet layers never reach transformers' attention
interface), and with fla-core installed on a CPU the forward raised `RuntimeError: 0 active
drivers` inside FLA's autotuner, reported as `target-raised` where `--model` says
`kernel-unavailable`. Run by hand on such a CPU it still raises that: FLA's kernels cannot run there.

`--fla-ops` also imports FLA's gated delta rule itself (`fla.ops.gated_delta_rule`, fla-core 0.6.0),
as a script with layers of its own on FLA's ops does; `--compile BACKEND` runs the model under
`torch.compile(model, backend=BACKEND)`. The model runs on the GPU where there is one.
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

parser = argparse.ArgumentParser()
parser.add_argument("--fla-ops", action="store_true")
parser.add_argument("--compile", metavar="BACKEND")
args = parser.parse_args()
if args.fla_ops:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401

config = Qwen3_5TextConfig(
    hidden_size=192,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=1,
    head_dim=64,
    intermediate_size=384,
    vocab_size=1024,
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = AutoModelForCausalLM.from_config(config).to(device).eval()
step = torch.compile(model, backend=args.compile) if args.compile else model
with torch.no_grad():  # a frozen target, as in DFlash training
    step(input_ids=torch.randint(0, config.vocab_size, (1, 64), device=device))
