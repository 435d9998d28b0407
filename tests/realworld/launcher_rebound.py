"""Real-code case: a training launcher whose model module (titan_attention_module.py) calls a compiled
flex_attention kept on a class (`FlexAttention._compiled_flex_attn`), and which, in a deterministic
debug mode, rebinds that class attribute to the raw flex_attention, as torchtitan's own
`set_determinism` does on ROCm: pytorch/torchtitan@06562f393dba9e79a37d733ac3487fc89b26c858
torchtitan/distributed/utils.py ("Use eager flex attention for determinism on ROCm":
`FlexAttention._compiled_flex_attn = flex_attention`). Re-written in our own words, tiny sizes.

Every layer's call line in the model module still reads `_compiled_flex_attn`, yet each call runs
flex's dense kernel. `--rebind launcher` rebinds in this script; `--rebind exec` runs the same
assignment from a string the launcher exec()s (a patch in a job config); `--rebind runpy` runs the
patch file titan_determinism_patch.py with runpy.run_path. No `--rebind` is the healthy twin.
On the CPU flex has no backward, so the CPU run is a forward (no grad); `--train` runs forward and
backward (`--device cuda --train` on a GPU).
"""

import argparse
import os
import runpy
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from titan_attention_module import SEQ, VOCAB, FlexAttention, Transformer, causal

parser = argparse.ArgumentParser()
parser.add_argument("--rebind", choices=["launcher", "exec", "runpy"])
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

DETERMINISM_PATCH = """
from torch.nn.attention.flex_attention import flex_attention
from titan_attention_module import FlexAttention
FlexAttention._compiled_flex_attn = flex_attention
"""

if args.rebind == "launcher":
    # deterministic debug run: flex attention uncompiled
    FlexAttention._compiled_flex_attn = flex_attention
elif args.rebind == "exec":
    exec(DETERMINISM_PATCH, {})
elif args.rebind == "runpy":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "titan_determinism_patch.py"))

model = Transformer().to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
mask = create_block_mask(causal, None, None, SEQ, SEQ, device=args.device)
with torch.set_grad_enabled(args.train):
    for _ in range(args.steps):
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), device=args.device)
        logits = model(tokens[:, :-1], mask)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        if args.train:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
