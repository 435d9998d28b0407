"""Why a "compiled" flex_attention still ran dense, read from dynamo's compile records.

Shared by the judges: a recompile-limit failure and an exception that got a frame skipped are the
two silent fallbacks to eager; a wrapper compiled with a backend that never reaches Inductor is the
third way to run the dense kernels under torch.compile.
"""

from __future__ import annotations

import re
from typing import Any

RECOMPILE_LIMIT_MARKERS = ("recompile limit", "recompile_limit", "cache_size_limit")
RAISED = re.compile(r"raised exception (\w+)\((.*?)\)\s*$", re.MULTILINE)
DENSE_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition")  # no Inductor: flex runs dense


def recompile_limit_record(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first compile that failed because the recompile limit was hit."""
    for record in records:
        reason = (record.get("fail_reason") or "").lower()
        if any(marker in reason for marker in RECOMPILE_LIMIT_MARKERS):
            return record
    return None


def skipped_frame_record(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first compile whose frame raised, which makes dynamo skip that code for the process."""
    for record in records:
        if record.get("fail_type") and RAISED.search(record.get("fail_reason") or ""):
            return record
    return None
