"""What every judge collects, and the one ProbeResult it becomes."""

from __future__ import annotations

import re
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.report import Check, CheckStatus, Comparison, Finding, Plot, ProbeResult, Table, Where

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
    """Collects one section's checks, findings and measurements, then holds them to the budgets."""

    def __init__(self, probe: str, budgets: Budgets) -> None:
        self.probe = probe
        self.budgets = budgets
        self.findings: list[Finding] = []
        self.checks: list[Check] = []
        self.measurements: dict[str, Any] = {}
        self.comparisons: list[Comparison] = []
        self.tables: list[Table] = []
        self.plots: list[Plot] = []
        self.subject = ""

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

    def _over_budget(self, budget: str, measured: Any, limit: Any, what: str) -> None:
        self.findings.append(
            finding(
                "budget-exceeded",
                f"{self.probe}: {what} {measured} is over the budget {budget} = {limit}",
                detail=f"The gate's configuration allows {budget} = {limit}; this run measured {measured}.",
                evidence={"budget": budget, "limit": limit, "measured": measured, "probe": self.probe},
                fix="Fix the cause the probe's own findings name, or raise the budget in [tool.dflashdoctor] "
                "if the new figure is intended.",
            )
        )
        self._check(f"budget {budget}", "fail", f"{measured} > {limit}", "budget-exceeded")

    def _hold_to_budgets(self) -> None:
        """The gate's budgets on what this section measured (recompiles, graph breaks, compile time)."""
        budgets, m = self.budgets, self.measurements
        if not budgets.held_by_gate:
            return
        recompiles = m.get("recompiles")
        if isinstance(recompiles, int) and recompiles > budgets.max_recompiles:
            self._over_budget("max_recompiles", recompiles, budgets.max_recompiles, "recompiles")
        breaks = m.get("graph_breaks")
        count = sum(breaks.values()) if isinstance(breaks, dict) else breaks
        if isinstance(count, int) and count > budgets.max_graph_breaks:
            self._over_budget("max_graph_breaks", count, budgets.max_graph_breaks, "graph breaks")
        compile_s, limit = m.get("compile_s"), budgets.max_compile_seconds
        if limit is not None and isinstance(compile_s, int | float) and compile_s > limit:
            self._over_budget("max_compile_seconds", round(compile_s, 2), limit, "compile seconds")

    def _accept(self, codes: set[str], status: CheckStatus, why: str) -> None:
        """The budgets accept what `codes` stand for: their findings go, and a failed check that stood
        for them (and for no error still found) becomes `status`, saying why."""
        self.findings = [f for f in self.findings if f.code not in codes]
        still_errors = {f.code for f in self.findings if f.severity == "error"}
        for check in self.checks:
            if check.status == "fail" and set(check.codes) & codes and not set(check.codes) & still_errors:
                check.status, check.summary = status, f"{why}: {check.summary}"

    def result(self) -> ProbeResult:
        """The section held to the budgets, and settled as the report settles it (`ProbeResult.settle`)."""
        self._hold_to_budgets()
        if not self.budgets.require_fused_backward:  # the team accepts a dense backward (a forward-only job)
            self._accept({"dense-backward"}, "info", "allowed (require_fused_backward = false)")
        result = ProbeResult(
            probe=self.probe,
            findings=self.findings,
            measurements=self.measurements,
            checks=self.checks,
            comparisons=self.comparisons,
            tables=self.tables,
            subject=self.subject,
            plots=self.plots,
        )
        result.settle()
        return result
