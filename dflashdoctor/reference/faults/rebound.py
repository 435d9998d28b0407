"""Fault: the compiled wrapper exists, but a later assignment rebinds its name to the raw function.

Code in the wild does this behind a debug switch or when a patch re-imports flex_attention; the
entry still reads `_compiled_flex_attention`, which no longer is compiled.
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
    return _compiled_flex_attention(query, key, value, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale)


DEBUG_ATTENTION = True
if DEBUG_ATTENTION:
    _compiled_flex_attention = flex_attention
