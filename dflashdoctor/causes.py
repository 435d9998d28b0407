"""Findings grouped by cause, the way a person reads them: one entry per (code, fix, line) with the
places it showed up in listed under it (layers, ranks, processes, sections), the root cause first.

One `backend="eager"` wrapper makes every layer's forward and backward run dense: ten findings of
two codes with one fix at one line. Told ten times, the cause drowns; told twice with its five
layers each, it reads like ruff's or mypy's grouped output. The order puts what started a failure
before what it led to: an out-of-memory or a hang before "the command exited with 1".

Standard library only: report.py writes the groups into report.json."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflashdoctor.report import Finding, Report, Where

# what starts a failure, told first; what only follows from another finding, told last
_ROOTS = ("oom", "hang", "run-timeout", "kernel-out-of-resources", "autotuner-race")
_CONSEQUENCES = ("child-failed", "processes-left-running", "run-interrupted")
_SEVERITIES = ("error", "warning", "info")


@dataclass
class Place:
    """One finding of a cause: where it was and in which section (a process of a run, a probe)."""

    section: str
    title: str
    where: str = ""
    rank: int | None = None
    pid: int | None = None

    def label(self) -> str:
        """The place in one line: its title (which names the layer or call), its process."""
        process = [f"rank {self.rank}"] if self.rank is not None and f"rank {self.rank}" not in self.title else []
        process += [f"pid {self.pid}"] if self.pid else []
        return self.title + (f" ({', '.join(process)})" if process else "")


@dataclass
class Cause:
    findings: list[Finding]
    places: list[Place] = field(default_factory=list)

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def code(self) -> str:
        return self.first.code

    @property
    def severity(self) -> str:
        return self.first.severity

    @property
    def where(self) -> Where | None:
        return self.first.where

    @property
    def fix(self) -> str:
        return self.first.fix

    @property
    def count(self) -> int:
        return len(self.findings)

    @cached_property  # read once the grouping is done (every place's label asks for it)
    def title(self) -> str:
        """The finding's own title when it is told once or every place says the same; the part all
        say after their place (`layers.3.self_attn: <this>`) when only the place differs; else the
        first's, with how many more there are (the places name each)."""
        titles = {f.title for f in self.findings}
        if len(titles) == 1:
            return self.first.title
        tails = {title.split(": ", 1)[-1] for title in titles}
        if len(tails) == 1:
            return tails.pop()
        return f"{self.first.title}; and {self.count - 1} more like it"

    def place_label(self, place: Place) -> str:
        """A place as the cause's list shows it: only what differs from the cause's title (the
        layer, the call), with its process; where every place has the same title, its line and
        module, else its section (a process of a run)."""
        title = self.title
        short = place.title.removesuffix(f": {title}") if place.title != title else place.where or place.section
        return Place(place.section, short, place.where, place.rank, place.pid).label()

    def to_dict(self) -> dict[str, Any]:
        where = self.where
        return {
            "code": self.code,
            "severity": self.severity,
            "title": self.title,
            "where": where.label() if where is not None else None,
            "fix": self.fix,
            "count": self.count,
            "places": [{k: v for k, v in vars(place).items() if v not in (None, "")} for place in self.places],
        }


def _key(found: Finding) -> tuple[str, str, str, str, int]:
    file, line = (found.where.file or "", found.where.line or 0) if found.where is not None else ("", 0)
    return found.code, found.severity, found.fix, file, line


def _rank(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def causes(report: Report) -> list[Cause]:
    """The report's findings grouped by cause, root causes first, consequences last, otherwise by
    severity and then the order they were found."""
    return group((result.probe, found) for result in report.results for found in result.findings)


def group(found_in: Iterable[tuple[str, Finding]]) -> list[Cause]:
    """Findings, each with the section it is in, grouped by cause and ordered as `causes` says."""
    grouped: dict[tuple[str, str, str, str, int], Cause] = {}
    for section, found in found_in:
        cause = grouped.setdefault(_key(found), Cause([]))
        cause.findings.append(found)
        module = found.where.module if found.where is not None else None
        where = found.where.label() + (f" ({module})" if module else "") if found.where is not None else ""
        evidence = found.evidence if isinstance(found.evidence, dict) else {}
        cause.places.append(Place(section, found.title, where, _rank(evidence.get("rank")), _rank(evidence.get("pid"))))

    def order(indexed: tuple[int, Cause]) -> tuple[int, int, int]:
        index, cause = indexed
        standing = 0 if cause.code in _ROOTS else 2 if cause.code in _CONSEQUENCES else 1
        severity = _SEVERITIES.index(cause.severity) if cause.severity in _SEVERITIES else len(_SEVERITIES)
        return severity, standing, index

    return [cause for _, cause in sorted(enumerate(grouped.values()), key=order)]
