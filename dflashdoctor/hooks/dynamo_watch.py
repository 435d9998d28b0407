"""What dynamo did during each phase of a probe: compiles, recompiles and their reasons, failures.

Dynamo keeps one CompilationMetrics record per frame compile attempt, with the failed guard of a
recompile (`recompile_reason`), the exception that stopped a compile (`fail_type`, `fail_reason`),
and timings. Reading those beats parsing logs: they exist whatever TORCH_LOGS says. The record
layout varies between torch releases, so every field is read with getattr and missing ones are None.
"""

from __future__ import annotations

from typing import Any

_FIELDS = (
    "compile_id",
    "co_name",
    "co_filename",
    "co_firstlineno",
    "recompile_reason",
    "fail_type",
    "fail_reason",
    "fail_user_frame_filename",
    "fail_user_frame_lineno",
    "entire_frame_compile_time_s",
    "num_graph_breaks",
    "inductor_fx_local_cache_hit_count",
    "inductor_fx_local_cache_miss_count",
)
_TEXT_LIMIT = 2000


def _record(metrics: Any, phase: str) -> dict[str, Any]:
    record: dict[str, Any] = {"phase": phase}
    for name in _FIELDS:
        value = getattr(metrics, name, None)
        if isinstance(value, str) and len(value) > _TEXT_LIMIT:
            value = value[:_TEXT_LIMIT]
        record[name] = value if value is None or isinstance(value, int | float | str) else str(value)
    return record


class DynamoWatch:
    """Collects new compilation records and graph-break counts, labelled by phase."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.graph_breaks: dict[str, int] = {}
        self.unavailable: str | None = None
        self._seen: set[str] = set()
        self._graph_break_base: dict[str, int] = {}
        try:
            from torch._dynamo.utils import counters, get_compilation_metrics
        except ImportError as exc:
            self.unavailable = f"torch._dynamo.utils has no compilation metrics here: {exc}"
            return
        self._metrics = get_compilation_metrics
        self._counters = counters
        self._graph_break_base = dict(counters["graph_break"])
        self.collect("before")

    def collect(self, phase: str) -> list[dict[str, Any]]:
        """Records that appeared since the last call, labelled with `phase`."""
        if self.unavailable:
            return []
        new = []
        for metrics in self._metrics():
            key = f"{getattr(metrics, 'compile_id', None)}|{getattr(metrics, 'co_name', None)}"
            if key in self._seen:
                continue
            self._seen.add(key)
            if phase != "before":
                new.append(_record(metrics, phase))
        self.records.extend(new)
        for reason, count in self._counters["graph_break"].items():
            delta = count - self._graph_break_base.get(reason, 0)
            if delta > 0:
                self.graph_breaks[reason[:_TEXT_LIMIT]] = delta
        return new
