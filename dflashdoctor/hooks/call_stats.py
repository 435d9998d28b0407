"""What every attention call site accumulates, whichever recorder saw it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def mask_kind(mask: Any) -> str:
    return type(mask).__name__ if mask is not None else "none"


def mask_sparsity_pct(mask: Any) -> float | None:
    """Share of (query block, key block) tiles a BlockMask lets flex_attention skip.

    `BlockMask.sparsity()` divides by the sequence area in whole 128x128 tiles, which goes negative
    when a sequence is shorter than one tile, so the share is counted here from the block counts.
    """
    try:
        partial = mask.kv_num_blocks
        full = mask.full_kv_num_blocks
        kv_len, kv_block = mask.seq_lengths[1], mask.BLOCK_SIZE[1]
    except AttributeError:
        return None
    tiles = partial.numel() * math.ceil(kv_len / kv_block)
    computed = int(partial.sum()) + (int(full.sum()) if full is not None else 0)
    return round(100.0 * (1 - computed / tiles), 2) if tiles else None


@dataclass(kw_only=True)
class CallStats:
    calls: int = 0
    dense_forward: int = 0
    training: bool | None = None
    q_shape: list[int] = field(default_factory=list)
    kv_shape: list[int] = field(default_factory=list)
    dtype: str = ""
    mask: str = ""
    mask_sparsity_pct: float | None = None

    def observe(self, query: Any, key: Any, mask: Any, *, training: bool, dense_forward: int) -> None:
        """One more call; the first call's mask stands for the site (sparsity costs a reduction)."""
        self.calls += 1
        self.dense_forward += dense_forward
        self.training = training
        self.q_shape, self.kv_shape = list(query.shape), list(key.shape)
        self.dtype = str(query.dtype).replace("torch.", "")
        if self.calls == 1:
            self.mask, self.mask_sparsity_pct = mask_kind(mask), mask_sparsity_pct(mask)
