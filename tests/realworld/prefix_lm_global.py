"""Real-code case: a prefix-LM mask_mod in the style of meta-pytorch/attention-gym
(attn_gym/masks/prefix_lm.py, `generate_prefix_lm_mask`), written instead as many training scripts
do: the mask reads a module-level Python int that the loop sets per batch. Each new value fails
dynamo's guard on that global, so the compiled wrapper recompiles until the recompile limit (lowered
to 3 here, to keep the case short), then runs flex dense. `--tensor` is the healthy twin: the prefix
length lives in a tensor, updated in place.
"""

import sys

import torch
from torch.nn.attention.flex_attention import flex_attention

torch._dynamo.config.recompile_limit = 3
compiled_flex = torch.compile(flex_attention)
PREFIX_LENGTH = 0
prefix_tensor = torch.tensor(0)


def prefix_lm_global(score, b, h, q_idx, kv_idx):
    return torch.where((kv_idx <= q_idx) | (kv_idx < PREFIX_LENGTH), score, -float("inf"))


def prefix_lm_tensor(score, b, h, q_idx, kv_idx):
    return torch.where((kv_idx <= q_idx) | (kv_idx < prefix_tensor), score, -float("inf"))


score_mod = prefix_lm_tensor if "--tensor" in sys.argv else prefix_lm_global
q = torch.randn(1, 4, 64, 16)
with torch.no_grad():
    for prefix in range(1, 8):
        PREFIX_LENGTH = prefix
        prefix_tensor.fill_(prefix)
        compiled_flex(q, q, q, score_mod=score_mod)
