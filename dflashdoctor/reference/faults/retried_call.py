"""Fault: an attempt that raises inside the compiled frame, caught and retried.

Here the first attempt leaves out `enable_gqa`, flex_attention raises ValueError for the head
mismatch, and the code retries with GQA on. The retry succeeds, but the exception inside the
compiled frame made dynamo mark flex_attention's code object as skipped for the rest of the
process, so this call and every later one (through any wrapper) runs the dense kernel.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

_compiled_flex_attention = torch.compile(flex_attention)


def flex_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: BlockMask | None = None,
    enable_gqa: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    try:
        return _compiled_flex_attention(query, key, value, block_mask=block_mask, scale=scale)
    except ValueError:
        return _compiled_flex_attention(query, key, value, block_mask=block_mask, enable_gqa=True, scale=scale)
