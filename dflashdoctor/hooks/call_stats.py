"""What every attention call site accumulates, whichever recorder saw it."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.hooks.dynamo_skip import skip_tree
from dflashdoctor.hooks.flex_dense import DenseEvent
from dflashdoctor.records import SourceSite


@functools.lru_cache(maxsize=64)
def _dtype_text(dtype: Any) -> str:
    """`bfloat16` for torch.bfloat16: str() of a dtype builds a new string every call."""
    return str(dtype).replace("torch.", "")


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
        tiles = partial.numel() * math.ceil(kv_len / kv_block)
        computed = int(partial.sum()) + (int(full.sum()) if full is not None else 0)
    except Exception:  # not a BlockMask, or the device is in an error state (after an OOM or an assert)
        return None
    return round(100.0 * (1 - computed / tiles), 2) if tiles else None


@dataclass(kw_only=True)
class CallStats:
    """Counts and shapes of one call site, and the dense kernels charged to it.

    Subclasses add where the site is (`file`, `line`, `function`, `module`).
    """

    calls: int = 0  # eager calls; a call inside a compiled graph runs no Python and is not counted
    in_compiled_region: bool = False  # the site's calls run inside an outer compiled graph
    backend: str | None = None  # the torch.compile backend its calls run under, when known
    compiled_into_graphs: int = 0  # times dynamo traced this site into such a graph
    dense_forward: int = 0
    dense_backward: int = 0
    dense_forward_peak_bytes: int | None = None  # the most CUDA memory one dense forward kernel added
    dense_backward_peak_bytes: int | None = None  # likewise for the backward kernel
    score_matrix_bytes: int = 0  # float32 scores one dense kernel of this site builds
    training: bool | None = None
    q_shape: list[Any] = field(default_factory=list)  # symbolic sizes as text when traced in a graph
    kv_shape: list[Any] = field(default_factory=list)
    dtype: str = ""
    mask: str = ""
    mask_sparsity_pct: float | None = None

    def observe(self, query: Any, key: Any, mask: Any, *, training: bool, dense: list[DenseEvent]) -> None:
        """One more call, with the dense kernel events it caused; the first call's mask stands for the
        site (sparsity costs a reduction)."""
        self.calls += 1
        if dense:
            forward = [event for event in dense if event.kind == "forward"]
            self.dense_forward += len(forward)
            for event in forward:
                event.forward_site = self._charge(event)
        self.training = training
        self.q_shape, self.kv_shape = list(query.shape), list(key.shape)
        self.dtype = _dtype_text(query.dtype)
        if self.calls == 1:
            self.mask, self.mask_sparsity_pct = mask_kind(mask), mask_sparsity_pct(mask)

    def observe_traced(
        self, backend: str | None, query: tuple[list[Any], str] | None, key: tuple[list[Any], str] | None
    ) -> None:
        """One more outer compiled graph this site was traced into, with its backend (which also
        compiles a compiled wrapper inlined there) and the shapes dynamo saw."""
        self.in_compiled_region = True
        self.backend = backend
        self.compiled_into_graphs += 1
        if query is not None and key is not None:
            (self.q_shape, self.dtype), self.kv_shape = query, key[0]

    def charge_backward(self, event: DenseEvent) -> SourceSite:
        self.dense_backward += 1
        return self._charge(event)

    def _charge(self, event: DenseEvent) -> SourceSite:
        """Take the event's cost; return where this site is, for the event to carry."""
        self.score_matrix_bytes = max(self.score_matrix_bytes, event.score_matrix_bytes)
        if event.peak_bytes is not None:
            field_name = f"dense_{event.kind}_peak_bytes"
            setattr(self, field_name, max(getattr(self, field_name) or 0, event.peak_bytes))
        # the subclass's fields where it has them (a site without a file has none)
        return SourceSite(
            file=getattr(self, "file", None),
            line=getattr(self, "line", None),
            function=getattr(self, "function", None),
            module=getattr(self, "module", None),
        )


skip_tree(CallStats.observe)  # bookkeeping, called from stand-ins' frames (dynamo_skip.py says why)
