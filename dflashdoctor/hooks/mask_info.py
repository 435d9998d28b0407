"""What a call's attention mask is, in words a report can show: its type and, for a BlockMask,
the share of (query block, key block) tiles that flex_attention skips.

`BlockMask.sparsity()` divides by the sequence area in whole 128x128 tiles, which goes negative
when a sequence is shorter than one tile, so the share is counted here from the block counts.
"""

from __future__ import annotations

import math
from typing import Any


def mask_kind(mask: Any) -> str:
    return type(mask).__name__ if mask is not None else "none"


def mask_sparsity_pct(mask: Any) -> float | None:
    try:
        partial = mask.kv_num_blocks
        full = mask.full_kv_num_blocks
        kv_len, kv_block = mask.seq_lengths[1], mask.BLOCK_SIZE[1]
    except AttributeError:
        return None
    tiles = partial.numel() * math.ceil(kv_len / kv_block)
    computed = int(partial.sum()) + (int(full.sum()) if full is not None else 0)
    return round(100.0 * (1 - computed / tiles), 2) if tiles else None
