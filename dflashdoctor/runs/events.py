"""Reading back what the instrumented processes wrote: one `ProcessLog` per process."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashdoctor.placed_files import MIB, open_placed

_CHUNK_BYTES = 8 * MIB


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


_KEPT = 10_000  # records of one kind kept per process: the agent writes far fewer (it coalesces)


def _keep(records: list[dict[str, Any]], record: dict[str, Any]) -> None:
    """Appended; past twice _KEPT the oldest go, so a file of millions of records stays bounded."""
    records.append(record)
    if len(records) > 2 * _KEPT:
        del records[:-_KEPT]


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
            _keep(self.steps, record)
        elif kind == "dense":
            _keep(self.dense, {"t": record.get("t"), **record["event"]})
        elif kind == "exception":
            _keep(self.exceptions, record)
        elif kind == "oom":
            _keep(self.ooms, record)
        elif kind == "agent-error":
            _keep(self.agent_errors, record)
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
        """What was appended since the last call, in chunks: an events file of hundreds of megabytes
        (or a link to /dev/zero, or a FIFO, placed in the folder) costs a chunk of memory, not its size.
        A line longer than a chunk is no record of the agent's: counted damaged and skipped."""
        file_pid = _pid_of(path)
        try:
            fd = open_placed(path)
        except OSError:
            return
        with os.fdopen(fd, "rb") as handle:
            handle.seek(self._offsets.get(path, 0))
            pending = b""
            while True:
                chunk = handle.read(_CHUNK_BYTES)
                if not chunk:
                    break
                data = pending + chunk
                end = data.rfind(b"\n") + 1
                self._lines(data[:end], file_pid)
                self._offsets[path] = self._offsets.get(path, 0) + end
                pending = data[end:]
                if len(pending) > _CHUNK_BYTES:  # no line of the agent's is this long
                    self._damaged(file_pid)
                    self._offsets[path] += len(pending)
                    pending = b""
        if final and pending.strip():
            self._damaged(file_pid)

    def _lines(self, complete: bytes, file_pid: int | None) -> None:
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = None
            if well_formed(record):
                self.logs.setdefault(record["pid"], ProcessLog(record["pid"])).add(record)
            elif line.strip():
                self._damaged(file_pid)

    def _damaged(self, file_pid: int | None) -> None:
        if file_pid is not None:
            self.logs.setdefault(file_pid, ProcessLog(file_pid)).damaged_lines += 1


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
