"""What `run` observed: the command, how it ended, and every process's events, read back on the
doctor's side (the agent writes the events; nothing here runs in the command's processes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflashdoctor.observations import load
from dflashdoctor.runs.events import ProcessLog, read_logs
from dflashdoctor.runs.watch import Outcome


@dataclass
class RunObservations:
    """`run`: the command, how it ended, and every process's events (kept in the report folder's
    `events/`, one JSON-lines file per process, which `processes` is read back from)."""

    command: list[str] = field(default_factory=list)
    outcome: Outcome = field(default_factory=lambda: Outcome(returncode=None, duration_s=0.0))
    processes: list[ProcessLog] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """observations.json's part: the events stay in their files."""
        return {"command": self.command, "outcome": asdict(self.outcome), "events": "events"}

    @classmethod
    def read(
        cls, data: dict[str, Any], events: Path, folder: int | None = None, owners: frozenset[int] | None = None
    ) -> RunObservations:
        """Observations written by `run`, with the events read back from `events` (through the open
        `folder`, whose files must belong to `owners`, when given: read_logs)."""
        run = load(cls, {k: v for k, v in data.items() if k != "processes"})
        hang = run.outcome.hang
        if hang and isinstance(hang.get("stacks"), dict):  # JSON made the pids strings
            hang["stacks"] = {int(pid): stacks for pid, stacks in hang["stacks"].items()}
        run.processes = read_logs(events, folder, owners)
        return run
