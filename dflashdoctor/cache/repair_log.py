"""What a fix or restore did and refused, as records: the judge reads them and the observations
carry them, on machines that only scan too, so they need nothing of the quarantine that made them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EntryOutcome:
    original: str
    state: str  # moved, already-moved, failed, missing | restored, in-place, missing, conflict, changed, failed
    detail: str = ""


@dataclass
class QuarantineRun:
    folder: str
    outcomes: list[EntryOutcome] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "outcomes": [o.__dict__ for o in self.outcomes]}


@dataclass
class Refusal:
    """A quarantine folder, or a manifest, not believed: nothing of it was moved."""

    path: str
    reasons: list[str]


@dataclass
class RepairLog:
    """What fix or restore did and refused, for the judge."""

    fixed: list[tuple[str, QuarantineRun]] = field(default_factory=list)  # (root, run)
    restored: list[QuarantineRun] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    blocked: list[tuple[str, str, str]] = field(default_factory=list)  # (root, quarantine folder, why unusable)
    all_restored: list[str] = field(default_factory=list)  # quarantine folders with nothing left to restore

    def moved(self) -> set[str]:
        return {o.original for _, run in self.fixed for o in run.outcomes if o.state == "moved"}
