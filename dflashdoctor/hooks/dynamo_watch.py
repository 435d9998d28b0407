"""What dynamo did during each phase of a probe: compiles, recompiles and their reasons, failures.

Dynamo keeps one CompilationMetrics record per frame compile attempt, with the failed guard of a
recompile (`recompile_reason`), the exception that stopped a compile (`fail_type`, `fail_reason`),
and timings. Reading those beats parsing logs: they exist whatever TORCH_LOGS says. The record
layout varies between torch releases, so every field is read with getattr and missing ones are None.

Graph breaks come from dynamo's own list, `torch._dynamo.utils.graph_break_reasons` (what
`torch._dynamo.explain` reports from): one GraphCompileReason per break, with the reason and the user
stack dynamo traced down to it. It is read, never hooked, so watching adds no handler, no log line
and no graph break; enabling the graph-breaks log instead would print to the user's stderr. It also
holds breaks the `graph_break` counter misses (a Python `if` on a tensor). A torch without the list,
or with records of another shape, leaves the sites empty and the counts come from the counter.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from dflashdoctor.records import CompileRecord
from dflashdoctor.redaction import redact_text

_TEXT_LIMIT = 2000
# Text that quotes the user's values: the exception that stopped a compile, a guard that failed
_USER_TEXT = frozenset({"fail_reason", "recompile_reason"})
_SITES_KEPT = 50  # distinct graph-break sites a watch keeps; further breaks are still counted
_STACK_KEPT = 16  # innermost frames kept of a break's user stack
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
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


def _text(metrics: Any, name: str) -> str | None:
    value = getattr(metrics, name, None)
    if value is None:
        return None
    text = redact_text(str(value)) if name in _USER_TEXT else str(value)  # redacted before the cut,
    return text[:_TEXT_LIMIT]  # which could halve a secret


def _int(metrics: Any, name: str) -> int | None:
    value = getattr(metrics, name, None)
    return value if isinstance(value, int) else None


def _float(metrics: Any, name: str) -> float | None:
    value = getattr(metrics, name, None)
    return value if isinstance(value, int | float) else None


def _record(metrics: Any, phase: str) -> CompileRecord:
    """The fields torch's CompilationMetrics has of records.CompileRecord; one missing, or of another
    type than the record's (a torch that changed it), is None."""
    recompile_reason = _text(metrics, "recompile_reason")
    return {
        "phase": phase,
        "compile_id": _text(metrics, "compile_id"),
        "co_name": _text(metrics, "co_name"),
        "co_filename": _text(metrics, "co_filename"),
        "co_firstlineno": _int(metrics, "co_firstlineno"),
        "recompile_reason": recompile_reason,
        "fail_type": _text(metrics, "fail_type"),
        "fail_reason": _text(metrics, "fail_reason"),
        "fail_user_frame_filename": _text(metrics, "fail_user_frame_filename"),
        "fail_user_frame_lineno": _int(metrics, "fail_user_frame_lineno"),
        "entire_frame_compile_time_s": _float(metrics, "entire_frame_compile_time_s"),
        "num_graph_breaks": _int(metrics, "num_graph_breaks"),
        "inductor_fx_local_cache_hit_count": _int(metrics, "inductor_fx_local_cache_hit_count"),
        "inductor_fx_local_cache_miss_count": _int(metrics, "inductor_fx_local_cache_miss_count"),
        "guard_file": guard_file(recompile_reason),
    }


def _frame(summary: Any) -> str | None:
    """A traceback.FrameSummary as `file:line in function` (judges/base.frame_where reads it back)."""
    filename, lineno, name = (getattr(summary, a, None) for a in ("filename", "lineno", "name"))
    return f"{filename}:{lineno} in {name}" if isinstance(filename, str) and isinstance(lineno, int) else None


class _BreakSites:
    """Dynamo's list of graph breaks, read from where the last read stopped, grouped by site.

    A group is one reason at one site: the frame dynamo broke in plus the innermost frame outside
    torch and dflashdoctor (the user's or a library's line that called into torch; a recording
    stand-in between them is never the site). A break nested n calls deep is taken n times, once
    per resumed frame, and the deepest resumes hold only torch's own frames: such a break joins the
    group that broke at the same frame for the same reason, so one cause is one group.
    `torch._dynamo.reset()` empties the list in place; a read then starts again from 0.
    """

    def __init__(self, reasons: list[Any], skipped: tuple[str, ...]) -> None:
        self._reasons = reasons
        self._skipped = skipped  # folders whose frames are never a site: torch's and this package's
        self._read = len(reasons)
        self._last = reasons[-1] if reasons else None  # held: identity tells a reset list apart
        self.groups: dict[tuple[str, str | None, str | None], dict[str, Any]] = {}
        self._depth: dict[tuple[str, str | None, str | None], int] = {}  # the longest stack seen per group

    def new(self) -> list[tuple[str, list[str]]]:
        """(reason, frames outermost first) of each break since the last call."""
        reasons, read = self._reasons, self._read
        if read and (len(reasons) < read or reasons[read - 1] is not self._last):
            read = 0
        fresh = reasons[read:]  # a copy: dynamo may append while this runs
        self._read = read + len(fresh)
        if fresh:
            self._last = fresh[-1]
        elif not read:
            self._last = None
        breaks = []
        for item in fresh:
            reason = getattr(item, "reason", None)
            stack = getattr(item, "user_stack", None)
            frames = [f for f in map(_frame, stack if isinstance(stack, list) else []) if f]
            text = redact_text(reason if isinstance(reason, str) else str(item))  # it may quote a constant
            breaks.append((text[:_TEXT_LIMIT], frames))
        return breaks

    def add(self, reason: str, frames: list[str]) -> None:
        broke_at = frames[-1] if frames else None
        outside = [f for f in frames if not f.startswith(self._skipped)]
        site = outside[-1] if outside else None
        key = (reason, broke_at, site)
        if site is None:  # a resumed torch frame: the group of the same break seen from its caller
            key = next((k for k in self.groups if k[:2] == (reason, broke_at)), key)
        group = self.groups.get(key)
        if group is None:
            if len(self.groups) >= _SITES_KEPT:
                return
            group = self.groups[key] = {"reason": reason, "count": 0, "site": site, "broke_at": broke_at}
            group.update(entry=None, stack=[])
            self._depth[key] = -1
        group["count"] += 1
        if len(frames) > self._depth[key]:  # the longest stack reaches furthest out: its entry is the one
            self._depth[key] = len(frames)
            group.update(entry=outside[0] if outside else group["entry"], stack=frames[-_STACK_KEPT:])


class DynamoWatch:
    """Collects new compilation records and graph breaks, labelled by phase.

    A record is new if this watch has not seen that object: compile ids start again at 0/0 after
    `torch._dynamo.reset()`, so an id says nothing. The records that were there before the watch
    began are kept apart, read into `earlier()` only when asked (a fallback from before still
    explains a dense call now; a watch per test block should not pay for reading them otherwise).
    `graph_breaks` counts each reason; `graph_break_sites` groups the same breaks by where they
    happened (observations.GraphBreakSite's fields), when this torch records where.
    """

    def __init__(self) -> None:
        self.records: list[CompileRecord] = []
        self._before: list[Any] = []
        self.graph_breaks: dict[str, int] = {}
        self.unavailable: str | None = None
        self._seen: dict[int, Any] = {}  # id -> the record itself, held so that its id is not reused
        self._graph_break_base: dict[str, int] = {}
        self._sites: _BreakSites | None = None
        try:
            import torch
            from torch._dynamo.utils import counters, get_compilation_metrics
        except ImportError as exc:
            self.unavailable = f"torch._dynamo.utils has no compilation metrics here: {exc}"
            return
        self._metrics = get_compilation_metrics
        self._counters = counters
        reasons = getattr(torch._dynamo.utils, "graph_break_reasons", None)
        if isinstance(reasons, list):
            self._sites = _BreakSites(reasons, (os.path.dirname(torch.__file__) + os.sep, _PACKAGE_DIR))
        else:
            self._graph_break_base = dict(counters["graph_break"])
        self.collect("before")

    @property
    def graph_break_sites(self) -> list[dict[str, Any]]:
        """One record per reason and site, most breaks first; empty where this torch keeps no list."""
        groups = self._sites.groups.values() if self._sites is not None else []
        return sorted((dict(g) for g in groups), key=lambda g: -g["count"])

    def earlier(self) -> list[CompileRecord]:
        """The records that were there before this watch began."""
        return [_record(metrics, "before") for metrics in self._before]

    def collect(self, phase: str) -> list[CompileRecord]:
        """Records that appeared since the last call, labelled with `phase`."""
        if self.unavailable:
            return []
        new: list[CompileRecord] = []
        for metrics in self._metrics():
            if id(metrics) in self._seen:
                continue
            self._seen[id(metrics)] = metrics
            if phase == "before":
                self._before.append(metrics)
            else:
                new.append(_record(metrics, phase))
        self.records.extend(new)
        if self._sites is not None:
            for reason, frames in self._sites.new():
                self.graph_breaks[reason] = self.graph_breaks.get(reason, 0) + 1
                self._sites.add(reason, frames)
            return new
        for reason, count in self._counters["graph_break"].items():
            delta = count - self._graph_break_base.get(reason, 0)
            if delta > 0:
                self.graph_breaks[reason[:_TEXT_LIMIT]] = delta
        return new
