"""Fault: flex_attention called directly, outside any torch.compile wrapper.

Eager flex_attention runs the dense kernel, which builds the whole [B, H, Lq, Lkv] float32 score
matrix; it warns once per process, so in a long run the warning is easy to miss.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention


def flex_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: BlockMask | None = None,
    enable_gqa: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    return flex_attention(query, key, value, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale)
