"""Real-code case: a tiny HF Llama (transformers, pip-installed; random weights) with
attn_implementation="flex_attention", compiled as a whole with `torch.compile(model, fullgraph=True)`.

Source: transformers==5.25.0 (src/transformers/masking_utils.py `flex_attention_mask`, which builds the
BlockMask inside the model's forward with `create_block_mask(..., _compile=True)`; torch 2.13's
create_block_mask answers `_compile=True` with a DeprecationWarning (`warnings.warn(...)`) before it
compiles itself; src/transformers/integrations/flex_attention.py `flex_attention_forward`). Written in
our own words, tiny sizes.

Default: fullgraph=True. `--no-fullgraph` is the twin a user reaches for first (fullgraph=False: the
mask creation may break the graph, flex stays in the model's Inductor graph). `--block-mask` keeps
fullgraph=True and builds the BlockMask outside the compiled model (torch's create_block_mask, causal),
passing it as `attention_mask`: transformers uses a 4-D BlockMask as given. `--reorder-warn` keeps
fullgraph=True and follows dynamo's own hint, `reorderable_logging_functions.add(warnings.warn)` (still
raises); `--ignore-warn` sets `torch._dynamo.config.ignore_logging_functions.add(warnings.warn)`. On the CPU flex has no
backward, so the CPU run is a forward (no grad); `--train` runs forward and backward (`--device cuda
--train` on a GPU).
"""

import argparse
import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser()
parser.add_argument("--no-fullgraph", action="store_true")
parser.add_argument("--block-mask", action="store_true", help="build the BlockMask outside, pass it in")
parser.add_argument("--reorder-warn", action="store_true", help="let dynamo defer warnings.warn (its hint)")
parser.add_argument("--ignore-warn", action="store_true", help="let dynamo drop warnings.warn")
parser.add_argument("--backend", default="inductor")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

config = LlamaConfig(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=256,
)
if args.reorder_warn:
    torch._dynamo.config.reorderable_logging_functions.add(warnings.warn)
if args.ignore_warn:
    torch._dynamo.config.ignore_logging_functions.add(warnings.warn)
model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention").to(args.device)
model.train(args.train)
if args.no_fullgraph:
    model = torch.compile(model, backend=args.backend, fullgraph=False)
else:
    model = torch.compile(model, backend=args.backend, fullgraph=True)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


mask = create_block_mask(causal, None, None, args.seq, args.seq, device=args.device) if args.block_mask else None
with torch.set_grad_enabled(args.train):
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (1, args.seq), device=args.device)
        out = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
        if args.train:
            out.loss.backward()
