"""A compiled flex_attention wrapper that asks for tiles larger than the GPU's shared memory holds:
the H200's 227 KB per block stands in for the ~100 KB of an RTX 4090/5090 or RTX PRO 6000, on which
flex's default backward tiles at head_dim 128 already do not fit. Called at head_dim 256 in float32,
one 128-row tile of K and one of V take 256 KB before anything else, even unpipelined. The query tile
is kept small and pipelining off: with 128-row query tiles and three stages the kernel needed 704 KB
and took ptxas 140 s to build on an H200 (torch 2.11), and Inductor retries a pipelined kernel that
does not fit with pipelining off, which builds it again.
"""

import torch
from torch.nn.attention.flex_attention import flex_attention

_compiled = torch.compile(flex_attention)
_TILES = {"BLOCK_M": 32, "BLOCK_N": 128, "num_stages": 1, "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 128, "bwd_num_stages": 1}


def too_large(query, key, value, block_mask=None, enable_gqa=False):
    return _compiled(query, key, value, block_mask=block_mask, enable_gqa=enable_gqa, kernel_options=_TILES)
