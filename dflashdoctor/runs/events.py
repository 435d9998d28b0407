"""Reading back what the instrumented processes wrote: one `ProcessLog` per process."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _memory(value: Any) -> bool:
    """Per device, the allocator's figures: numbers (a judge takes their maximum)."""
    return isinstance(value, dict) and all(
        isinstance(stats, dict) and all(_number(v) for v in stats.values() if v is not None) for stats in value.values()
    )


# What the readers of each kind of record rely on; a record that breaks it is a damaged line.
_FIELDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "start": {"argv": lambda v: isinstance(v, list), "env": lambda v: isinstance(v, dict), "ppid": _count},
    "step": {"step": _count, "memory": _memory, "step_s": lambda v: isinstance(v, dict)},
    "dense": {"event": lambda v: isinstance(v, dict)},
    "snapshot": {"observations": lambda v: isinstance(v, dict)},
    "oom": {"steps": _count},
}
_REQUIRED = {"dense": ("event",)}


def well_formed(record: Any) -> bool:
    """Whether a parsed event line is one the judges can read: a damaged or hostile record (a
    `"memory": 5`, a `"step": "abc"`) is counted as a damaged line instead of stopping the doctor."""
    if not isinstance(record, dict) or not _count(record.get("pid")):
        return False
    if "t" in record and not _number(record["t"]):
        return False
    if record.get("rank") is not None and not _count(record["rank"]):
        return False
    kind = record.get("kind")
    checks = _FIELDS.get(kind, {}) if isinstance(kind, str) else {}
    if any(name not in record for name in _REQUIRED.get(kind, ())):
        return False
    return all(name not in record or record[name] is None or check(record[name]) for name, check in checks.items())


@dataclass
class ProcessLog:
    pid: int
    rank: int | None = None
    start: dict[str, Any] = field(default_factory=dict)
    instrumented: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    dense: list[dict[str, Any]] = field(default_factory=list)
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    ooms: list[dict[str, Any]] = field(default_factory=list)
    agent_errors: list[dict[str, Any]] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None  # the last one
    last_event_t: float = 0.0
    damaged_lines: int = 0
    launcher: bool = False  # started other instrumented processes and has no rank (torchrun itself)

    @property
    def step_count(self) -> int:
        """Optimizer steps taken: a step record may cover many (the agent coalesces them), and the
        final snapshot counts the ones after the last record."""
        recorded = max((int(s.get("step") or 0) for s in self.steps[-1:]), default=0)
        final = (self.snapshot or {}).get("observations", {}).get("steps") if self.snapshot else None
        return max(recorded, final if isinstance(final, int) else 0)

    @property
    def label(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank} (pid {self.pid})"
        return f"{'launcher' if self.launcher else 'process'} {self.pid}"

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        self.last_event_t = max(self.last_event_t, float(record.get("t") or 0))
        if self.rank is None and isinstance(record.get("rank"), int):
            self.rank = record["rank"]
        if kind == "start":
            self.start = record
        elif kind == "instrumented":
            self.instrumented = record
        elif kind == "exit":
            self.exit = record
        elif kind == "step":
            self.steps.append(record)
        elif kind == "dense":
            self.dense.append({"t": record.get("t"), **record["event"]})
        elif kind == "exception":
            self.exceptions.append(record)
        elif kind == "oom":
            self.ooms.append(record)
        elif kind == "agent-error":
            self.agent_errors.append(record)
        elif kind == "snapshot":
            self.snapshot = record


class LogReader:
    """Reads the events folder incrementally: each call reads only what was appended since the last
    (the watch loop asks every few seconds; a long run's files grow large). A line not yet ended is
    left for the next call; one that does not parse (a process killed mid-write) is counted."""

    def __init__(self, events: Path) -> None:
        self.events = events
        self.logs: dict[int, ProcessLog] = {}
        self._offsets: dict[Path, int] = {}

    def update(self, *, final: bool = False) -> list[ProcessLog]:
        """`final`: the processes are gone, so an unended last line is a damaged one."""
        for path in sorted(self.events.glob("*.jsonl")):
            self._read(path, final)
        logs = self.logs.values()
        rank_parents = {log.start.get("ppid") for log in logs if log.rank is not None}
        for log in logs:
            log.launcher = log.rank is None and log.pid in rank_parents
        return sorted(logs, key=lambda log: (log.rank is None, log.rank or 0, log.pid))

    def _read(self, path: Path, final: bool) -> None:
        file_pid = _pid_of(path)
        try:
            with open(path, "rb") as handle:
                handle.seek(self._offsets.get(path, 0))
                data = handle.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offsets[path] = self._offsets.get(path, 0) + len(complete)
        if final and data[len(complete) :].strip() and file_pid is not None:
            self.logs.setdefault(file_pid, ProcessLog(file_pid)).damaged_lines += 1
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = None
            if not well_formed(record):
                if line.strip() and file_pid is not None:
                    self.logs.setdefault(file_pid, ProcessLog(file_pid)).damaged_lines += 1
                continue
            self.logs.setdefault(record["pid"], ProcessLog(record["pid"])).add(record)


def read_logs(events: Path) -> list[ProcessLog]:
    """Every process's log once the run is over, ordered by rank then pid."""
    return LogReader(events).update(final=True)


def _pid_of(path: Path) -> int | None:
    """Event files are `<host>-<pid>.jsonl`."""
    try:
        return int(path.stem.rsplit("-", 1)[1])
    except (ValueError, IndexError):
        return None


def last_activity(events: Path) -> dict[int, float]:
    """pid -> modification time of its events file: any event, progress included, moves it."""
    out = {}
    for path in events.glob("*.jsonl"):
        pid = _pid_of(path)
        try:
            if pid is not None:
                out[pid] = path.stat().st_mtime
        except OSError:
            continue
    return out
