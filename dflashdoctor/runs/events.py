"""Reading back what the instrumented processes wrote: one `ProcessLog` per process."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def read_logs(events: Path) -> list[ProcessLog]:
    """Every process's log, ordered by rank then pid; a half-written last line (a killed process)
    is counted and skipped."""
    logs: dict[int, ProcessLog] = {}
    for path in sorted(events.glob("*.jsonl")):
        file_pid = _pid_of(path)
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                    pid = int(record["pid"])
                except (ValueError, KeyError, TypeError):
                    if line.strip() and file_pid is not None:
                        logs.setdefault(file_pid, ProcessLog(file_pid)).damaged_lines += 1
                    continue
                logs.setdefault(pid, ProcessLog(pid)).add(record)
    rank_parents = {log.start.get("ppid") for log in logs.values() if log.rank is not None}
    for log in logs.values():
        log.launcher = log.rank is None and log.pid in rank_parents
    return sorted(logs.values(), key=lambda log: (log.rank is None, log.rank or 0, log.pid))


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
