"""Compiled flex_attention wrappers with faults only the compiled run shows, for check-compile.

`breaks`: the compiled function breaks its graph before the attention call (a print, as debugging
code leaves behind); the attention still fuses, in the second piece.
`drifts`: compiled, it doubles the softmax scale, which the eager reference does not (code that
reads `torch.compiler.is_compiling()`), so the compiled output disagrees with the reference.
"""

import torch
from torch.nn.attention.flex_attention import flex_attention


@torch.compile
def breaks(query, key, value, block_mask=None, enable_gqa=False, scale=None):
    torch._dynamo.graph_break()
    return flex_attention(query, key, value, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale)


@torch.compile
def drifts(query, key, value, block_mask=None, enable_gqa=False, scale=None):
    scale = (scale or query.shape[-1] ** -0.5) * (2.0 if torch.compiler.is_compiling() else 1.0)
    return flex_attention(query, key, value, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale)
