"""What every judge collects, and the one ProbeResult it becomes."""

from __future__ import annotations

import re
from typing import Any

from dflashdoctor.codes import finding
from dflashdoctor.report import Check, CheckStatus, Comparison, Finding, ProbeResult, Where

_FRAME = re.compile(r"^(?P<file>.+):(?P<line>\d+) in (?P<function>\S+)$")


def frame_where(frame: str | None) -> Where | None:
    """A stack line `file:line in function` (as the hooks format them) as a Where."""
    match = _FRAME.match(frame or "")
    if not match:
        return None
    return Where(file=match["file"], line=int(match["line"]), function=match["function"])


def size_text(n: float | None) -> str:
    """Bytes as GiB from a quarter GiB up, else MiB; `n/a` when not measured."""
    return "n/a" if n is None else f"{n / 2**30:.3g} GiB" if n >= 2**28 else f"{n / 2**20:.3g} MiB"


def count_text(n: float) -> str:
    """A large count the way model sizes are said: 3.49M, 26.9B."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:g}"


class Judge:
    def __init__(self, probe: str) -> None:
        self.probe = probe
        self.findings: list[Finding] = []
        self.checks: list[Check] = []
        self.measurements: dict[str, Any] = {}
        self.comparisons: list[Comparison] = []

    def _check(self, name: str, status: CheckStatus, summary: str, *codes: str) -> None:
        """One verdict line, with the finding codes it stands for."""
        self.checks.append(Check(name=name, status=status, summary=summary, codes=list(codes)))

    def _graph_break_check(self, breaks: dict[str, int], during: str) -> None:
        """One check line and, when there are any, a graph-break finding with each reason's count."""
        total = sum(breaks.values())
        if total:
            self.findings.append(
                finding(
                    "graph-break",
                    f"{total} graph breaks {during}",
                    detail="A graph break splits a compiled region; code between the pieces runs eagerly.",
                    evidence={"graph_breaks": breaks},
                    fix="Run with TORCH_LOGS=graph_breaks to see each break's line, and remove the cause.",
                )
            )
        self._check("graph breaks", "warn" if total else "pass", f"{total} graph breaks {during}", "graph-break")

    def result(self) -> ProbeResult:
        """The section, settled as the report settles it (`ProbeResult.settle`)."""
        result = ProbeResult(
            probe=self.probe,
            findings=self.findings,
            measurements=self.measurements,
            checks=self.checks,
            comparisons=self.comparisons,
        )
        result.settle()
        return result
