"""Reading back what the instrumented processes wrote: one `ProcessLog` per process."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashdoctor.observations import ObservationsError, RunSnapshot, check_record, load
from dflashdoctor.placed_files import MIB, open_placed
from dflashdoctor.records import (
    AgentErrorEvent,
    DenseKernelEvent,
    EventRecord,
    ExceptionEvent,
    ExitEvent,
    InstrumentedEvent,
    LoggedDense,
    OomEvent,
    SnapshotEvent,
    StartEvent,
    StepEvent,
)

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


# Each kind's type (a kind not listed, such as `progress`, is checked for its header only), and
# what the readers rely on beyond the types; a record that breaks either is a damaged line.
EVENT_TYPES: dict[str, Any] = {
    "start": StartEvent,
    "instrumented": InstrumentedEvent,
    "exit": ExitEvent,
    "step": StepEvent,
    "dense": DenseKernelEvent,
    "exception": ExceptionEvent,
    "oom": OomEvent,
    "agent-error": AgentErrorEvent,
    "snapshot": SnapshotEvent,
}
_VALUES: dict[str, dict[str, Callable[[Any], bool]]] = {
    "start": {"ppid": _count},
    "step": {"step": _count, "covers": _count, "memory": _memory},
    "oom": {"steps": _count},
}


def well_formed(record: Any) -> bool:
    """Whether a parsed event line is one the judges can read: of its kind's type (records.py), with
    sane values. A damaged or hostile record (a `"memory": 5`, a `"step": "abc"`, a negative pid) is
    counted as a damaged line instead of stopping the doctor. A snapshot's observations are loaded
    strictly where it is kept (ProcessLog.add)."""
    if not isinstance(record, dict) or not _count(record.get("pid")) or not _number(record.get("t")):
        return False
    if record.get("rank") is not None and not _count(record["rank"]):
        return False
    kind = record.get("kind")
    if not isinstance(kind, str):  # not an EventRecord's; an unhashable one would not even be looked up
        return False
    try:
        check_record(EVENT_TYPES.get(kind, EventRecord), record if kind in EVENT_TYPES else _header(record), kind)
    except ObservationsError:
        return False
    return all(check(record[name]) for name, check in _VALUES.get(kind, {}).items())


def _header(record: dict[str, Any]) -> dict[str, Any]:
    return {key: record.get(key) for key in ("t", "pid", "rank", "kind")}


_KEPT = 10_000  # records of one kind kept per process: the agent writes far fewer (it coalesces)


def _keep(records: list[Any], record: Any) -> None:
    """Appended; past twice _KEPT the oldest go, so a file of millions of records stays bounded."""
    records.append(record)
    if len(records) > 2 * _KEPT:
        del records[:-_KEPT]


@dataclass
class Snapshot:
    """The agent's last snapshot of a process: when, why, and its observations, loaded strictly."""

    t: float
    reason: str
    observations: RunSnapshot


@dataclass
class ProcessLog:
    """One process's events, each kind as records.py types it. The reader checks what the judges
    rely on (well_formed) and loads a snapshot strictly; a record that fails is a damaged line."""

    pid: int
    rank: int | None = None
    start: StartEvent | None = None
    instrumented: InstrumentedEvent | None = None
    exit: ExitEvent | None = None
    steps: list[StepEvent] = field(default_factory=list)
    dense: list[LoggedDense] = field(default_factory=list)
    exceptions: list[ExceptionEvent] = field(default_factory=list)
    ooms: list[OomEvent] = field(default_factory=list)
    agent_errors: list[AgentErrorEvent] = field(default_factory=list)
    snapshot: Snapshot | None = None  # the last one
    last_event_t: float = 0.0
    damaged_lines: int = 0
    launcher: bool = False  # started other instrumented processes and has no rank (torchrun itself)

    @property
    def step_count(self) -> int:
        """Optimizer steps taken: a step record may cover many (the agent coalesces them), and the
        final snapshot counts the ones after the last record."""
        recorded = max((s["step"] for s in self.steps[-1:]), default=0)
        return max(recorded, self.snapshot.observations.steps if self.snapshot else 0)

    @property
    def argv(self) -> list[str] | None:
        return self.start["argv"] if self.start else None

    @property
    def label(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank} (pid {self.pid})"
        return f"{'launcher' if self.launcher else 'process'} {self.pid}"

    def add(self, record: Any) -> None:
        """A well-formed record, kept by kind. A snapshot whose observations are not a RunSnapshot
        is an ObservationsError, and nothing of the record is kept."""
        kind = record["kind"]
        observations = load(RunSnapshot, record["observations"], strict=True) if kind == "snapshot" else None
        self.last_event_t = max(self.last_event_t, record["t"])
        if self.rank is None and record["rank"] is not None:
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
            _keep(self.dense, {"t": record["t"], **record["event"]})
        elif kind == "exception":
            _keep(self.exceptions, record)
        elif kind == "oom":
            _keep(self.ooms, record)
        elif kind == "agent-error":
            _keep(self.agent_errors, record)
        elif observations is not None:
            self.snapshot = Snapshot(record["t"], record["reason"], observations)


class LogReader:
    """Reads the events folder incrementally: each call reads only what was appended since the last
    (the watch loop asks every few seconds; a long run's files grow large). A line not yet ended is
    left for the next call; one that does not parse (a process killed mid-write) is counted."""

    def __init__(self, events: Path, folder: int | None = None, owners: frozenset[int] | None = None) -> None:
        """`folder`: the events folder, open (merge reads another node's through its descriptor), whose
        files must belong to one of `owners` if given."""
        self.events = events
        self.folder = folder
        self.owners = owners
        self.logs: dict[int, ProcessLog] = {}
        self._offsets: dict[Path, int] = {}

    def update(self, *, final: bool = False) -> list[ProcessLog]:
        """`final`: the processes are gone, so an unended last line is a damaged one."""
        names = os.listdir(self.folder) if self.folder is not None else [p.name for p in self.events.glob("*.jsonl")]
        for name in sorted(n for n in names if n.endswith(".jsonl")):
            self._read(self.events / name, final)
        logs = self.logs.values()
        rank_parents = {log.start["ppid"] for log in logs if log.rank is not None and log.start}
        for log in logs:
            log.launcher = log.rank is None and log.pid in rank_parents
        return sorted(logs, key=lambda log: (log.rank is None, log.rank or 0, log.pid))

    def _read(self, path: Path, final: bool) -> None:
        """What was appended since the last call, in chunks: an events file of hundreds of megabytes
        (or a link to /dev/zero, or a FIFO, placed in the folder) costs a chunk of memory, not its size.
        A line longer than a chunk is no record of the agent's: counted damaged and skipped."""
        file_pid = _pid_of(path)
        try:
            if self.folder is None:
                fd = open_placed(path)
            else:
                fd = open_placed(path.name, dir_fd=self.folder, owners=self.owners)
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
            try:
                if well_formed(record):
                    self.logs.setdefault(record["pid"], ProcessLog(record["pid"])).add(record)
                    continue
            except ObservationsError:
                pass
            if line.strip():
                self._damaged(file_pid)

    def _damaged(self, file_pid: int | None) -> None:
        if file_pid is not None:
            self.logs.setdefault(file_pid, ProcessLog(file_pid)).damaged_lines += 1


def read_logs(events: Path, folder: int | None = None, owners: frozenset[int] | None = None) -> list[ProcessLog]:
    """Every process's log once the run is over, ordered by rank then pid (`folder`, `owners`: as
    LogReader takes them)."""
    return LogReader(events, folder, owners).update(final=True)


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
