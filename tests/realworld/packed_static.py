"""Real-code case: torchtune 0.6.1's flex wrapper (pytorch/torchtune, torchtune/modules/attention_utils.py:
`flex_attention_compiled = torch.compile(flex_attention, dynamic=False)` called by
`compile_friendly_flex_attention(q, k, v, block_mask)`), reproduced in our own words with packed
sequences whose total length changes every step. Under `dynamic=False` every length is a new graph,
until the recompile limit (lowered to 3 here, to keep the case short) makes flex run dense.
`--dynamic` is the healthy twin: the same wrapper compiled without `dynamic=False`.
"""

import sys

import torch
from torch.nn.attention.flex_attention import flex_attention

torch._dynamo.config.recompile_limit = 3
if "--dynamic" in sys.argv:
    flex_attention_compiled = torch.compile(flex_attention)
else:
    flex_attention_compiled = torch.compile(flex_attention, dynamic=False)


def compile_friendly_flex_attention(q, k, v, block_mask=None):
    return flex_attention_compiled(q, k, v, block_mask=block_mask)


if __name__ == "__main__":  # `check-compile packed_static.py:compile_friendly_flex_attention` imports it
    with torch.no_grad():
        for packed in range(6):
            q = torch.randn(1, 4, 32 + 16 * packed, 16)
            compile_friendly_flex_attention(q, q, q)
