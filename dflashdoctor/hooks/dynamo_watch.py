"""What dynamo did during each phase of a probe: compiles, recompiles and their reasons, failures.

Dynamo keeps one CompilationMetrics record per frame compile attempt, with the failed guard of a
recompile (`recompile_reason`), the exception that stopped a compile (`fail_type`, `fail_reason`),
and timings. Reading those beats parsing logs: they exist whatever TORCH_LOGS says. The record
layout varies between torch releases, so every field is read with getattr and missing ones are None.
"""

from __future__ import annotations

import os
import re
import sys
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
_RESOLVED: dict[str, str] = {}  # a shortened path -> the loaded module's file it was found to be
_GUARD_LOCATION = re.compile(r"(?P<file>\S+):\d+ in \S+\s*$")  # the last `  # ` part of a recompile reason


def guard_file(reason: str | None) -> str | None:
    """The whole path of the file a recompile reason points at. Dynamo shortens it from the left
    (`mp/exp/model.py:6 in score`); the loaded module whose file ends so is the one, known only here
    in the probed process."""
    first = (reason or "").splitlines()[0] if reason else ""
    match = _GUARD_LOCATION.search(first.split("  # ")[-1]) if "  # " in first else None
    if match is None:
        return None
    short = match.group("file")
    if os.path.isabs(short) and os.path.isfile(short):
        return short
    tail = short.lstrip(".")
    if tail in _RESOLVED:
        return _RESOLVED[tail]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(tail):
            _RESOLVED[tail] = path
            return path
    return None


def _record(metrics: Any, phase: str) -> dict[str, Any]:
    record: dict[str, Any] = {"phase": phase}
    for name in _FIELDS:
        value = getattr(metrics, name, None)
        if isinstance(value, str) and len(value) > _TEXT_LIMIT:
            value = value[:_TEXT_LIMIT]
        record[name] = value if value is None or isinstance(value, int | float | str) else str(value)
    record["guard_file"] = guard_file(record["recompile_reason"])
    return record


class DynamoWatch:
    """Collects new compilation records and graph-break counts, labelled by phase.

    A record is new if this watch has not seen that object: compile ids start again at 0/0 after
    `torch._dynamo.reset()`, so an id says nothing. The records that were there before the watch
    began are kept apart, read into `earlier()` only when asked (a fallback from before still
    explains a dense call now; a watch per test block should not pay for reading them otherwise).
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._before: list[Any] = []
        self.graph_breaks: dict[str, int] = {}
        self.unavailable: str | None = None
        self._seen: dict[int, Any] = {}  # id -> the record itself, held so that its id is not reused
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

    def earlier(self) -> list[dict[str, Any]]:
        """The records that were there before this watch began."""
        return [_record(metrics, "before") for metrics in self._before]

    def collect(self, phase: str) -> list[dict[str, Any]]:
        """Records that appeared since the last call, labelled with `phase`."""
        if self.unavailable:
            return []
        new = []
        for metrics in self._metrics():
            if id(metrics) in self._seen:
                continue
            self._seen[id(metrics)] = metrics
            if phase == "before":
                self._before.append(metrics)
            else:
                new.append(_record(metrics, phase))
        self.records.extend(new)
        for reason, count in self._counters["graph_break"].items():
            delta = count - self._graph_break_base.get(reason, 0)
            if delta > 0:
                self.graph_breaks[reason[:_TEXT_LIMIT]] = delta
        return new
