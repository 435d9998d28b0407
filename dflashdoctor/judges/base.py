"""What every judge collects, and the one ProbeResult it becomes."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import PureWindowsPath
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.graph_breaks import read_break
from dflashdoctor.observations import GraphBreakSite
from dflashdoctor.report import Check, CheckStatus, Comparison, Finding, Plot, ProbeResult, Table, Where

_RAISE_IT = "raise the budget in [tool.dflashdoctor] if the new figure is intended."

_FRAME = re.compile(r"^(?P<file>.+):(?P<line>\d+) in (?P<function>\S+)$")
GRAPH_BREAK_SITES_SHOWN = 5  # graph-break findings a section names; the check line counts every site


def frame_where(frame: str | None) -> Where | None:
    """A stack line `file:line in function` (as the hooks format them) as a Where."""
    match = _FRAME.match(frame or "")
    if not match:
        return None
    return Where(file=match["file"], line=int(match["line"]), function=match["function"])


def frame_label(frame: str | None) -> str:
    """A stack line shortened to its file's name, for a title: `masking_utils.py:706 in flex_attention_mask`."""
    where = frame_where(frame)
    if where is None or where.file is None:
        return frame or "an unrecorded frame"
    name = PureWindowsPath(where.file).name  # either separator: a report may come from another machine
    return f"{name}:{where.line} in {where.function}"


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
        """One check line and the graph-break findings: one per site where dynamo recorded sites
        (the section's observations carry them as `graph_break_sites`), else one for all reasons.

        Every judge that reports graph breaks (check-compile, trace-attention, and run through
        trace-attention's judge) keeps its observations as `self.observations`, so the sites reach
        this one implementation without each caller passing them; observations from before sites
        were recorded, or from a torch that does not record them, read as none.
        """
        total = sum(breaks.values())
        sites = getattr(getattr(self, "observations", None), "graph_break_sites", None) or []
        shown = sites[:GRAPH_BREAK_SITES_SHOWN]
        if sites:
            self.findings.extend(self._graph_break_site(site, during) for site in shown)
        elif total:
            self.findings.append(self._graph_break_reasons(breaks, total, during))
        summary = f"{total} graph breaks {during}"
        if sites:
            summary += (
                f" at {len(sites)} sites"
                if len(sites) > 1
                else f" at {frame_label(sites[0].site or sites[0].broke_at)}"
            )
            if len(sites) > len(shown):
                summary += f" (the {len(shown)} with most breaks are named)"
        intentional = sum(s.count for s in sites if read_break(s.reason).intentional)
        if intentional:
            summary += f"; {intentional} of them a framework's own, on purpose"
        self._check("graph breaks", "warn" if total > intentional else "pass", summary, "graph-break")

    @staticmethod
    def _graph_break_site(site: GraphBreakSite, during: str) -> Finding:
        """One site's breaks: where, dynamo's reason in plain words, and the fix for that reason."""
        reading = read_break(site.reason, site.site, site.stack, site.entry)
        place = site.site or site.broke_at
        breaks = f"{site.count} graph {'break' if site.count == 1 else 'breaks'} {during}"
        title = f"{breaks}: {reading.title}" if reading.title else f"{breaks} at {frame_label(place)}: {reading.plain}"
        reached = f", reached from {site.entry}" if site.entry and site.entry != place else ""
        detail = reading.detail or (
            f"Dynamo's reason: {reading.plain}. It broke at {site.broke_at or 'an unrecorded frame'}{reached}. "
            "A graph break splits the compiled region: the code around it runs as plain Python on every call."
            + (
                f" {site.count} breaks at one site: dynamo breaks once for each compiled frame that reaches it "
                "(each function between the compiled entry and this line, as it resumes) and again after each "
                "recompile."
                if site.count > 1
                else ""
            )
        )
        evidence = {"breaks": site.count, **{k: v for k, v in asdict(site).items() if k != "count"}}
        return finding(
            "framework-graph-break" if reading.intentional else "graph-break",
            title,
            detail=detail,
            where=frame_where(place),
            evidence=evidence | ({"known_cause": reading.hazard} if reading.hazard else {}),
            fix=reading.fix,
            refs=[reading.page] if reading.page else [],
        )

    @staticmethod
    def _graph_break_reasons(breaks: dict[str, int], total: int, during: str) -> Finding:
        """Breaks known by reason only (dynamo's counter): each reason in plain words, and the fix
        for the most frequent."""
        ordered = sorted(breaks.items(), key=lambda item: -item[1])
        readings = [(read_break(reason), count) for reason, count in ordered]
        said = "; ".join(f"{reading.plain} ({count})" for reading, count in readings)
        return finding(
            "graph-break",
            f"{total} graph breaks {during}",
            detail=f"Dynamo's reasons: {said}. A graph break splits the compiled region: the code around it "
            "runs as plain Python on every call. This record names no site: `TORCH_LOGS=graph_breaks` prints "
            "each break's stack.",
            evidence={"graph_breaks": breaks},
            fix=readings[0][0].fix,
            refs=[reading.page for reading, _ in readings if reading.page][:1],
        )

    def _over_budget(
        self, budget: str, measured: Any, limit: Any, what: str, replaces: str | None = None, check: str | None = None
    ) -> None:
        """One fact, one finding, one check line: an overrun is the error the gate fails on, and takes
        the place of the section's own finding for that fact (`replaces`: the `recompiles` warning,
        whose guards it carries) and of that fact's check line (`check`), which now fails for it."""
        own = next((f for f in self.findings if f.code == replaces), None) if replaces else None
        if own is not None:
            self.findings.remove(own)
        allowed = f"The gate's configuration allows {budget} = {limit}; this run measured {measured}."
        self.findings.append(
            finding(
                "budget-exceeded",
                f"{self.probe}: {what} {measured} is over the budget {budget} = {limit}",
                detail=f"{allowed} {own.detail}" if own is not None else allowed,
                where=own.where if own is not None else None,
                evidence={"budget": budget, "limit": limit, "measured": measured, "probe": self.probe}
                | ({"finding": own.evidence} if own is not None else {}),
                fix=f"{own.fix} Or {_RAISE_IT}"
                if own is not None and own.fix
                else f"Fix the cause the probe's own findings name, or {_RAISE_IT}",
            )
        )
        line = next((c for c in self.checks if c.name == check), None) if check else None
        if line is None:
            self._check(f"budget {budget}", "fail", f"{measured} > {limit}", "budget-exceeded")
            return
        line.status = "fail"
        line.summary += f"; over the budget {budget} = {limit}"
        line.codes = [*line.codes, "budget-exceeded"]

    def _hold_to_budgets(self) -> None:
        """The gate's budgets on what this section measured (recompiles, graph breaks, compile time),
        each judged here once."""
        budgets, m = self.budgets, self.measurements
        if not budgets.held_by_gate:
            return
        recompiles = m.get("recompiles")
        if isinstance(recompiles, int) and recompiles > budgets.max_recompiles:
            self._over_budget(
                "max_recompiles", recompiles, budgets.max_recompiles, "recompiles", "recompiles", "varying lengths"
            )
        count = m.get("graph_breaks")  # every judge measures the total
        if isinstance(count, int) and count > budgets.max_graph_breaks:
            self._over_budget("max_graph_breaks", count, budgets.max_graph_breaks, "graph breaks", check="graph breaks")
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
