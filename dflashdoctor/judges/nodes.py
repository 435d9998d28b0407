"""Judges a gate across nodes: what each node's own gate found, side by side, and where nodes differ.

One bad node fails a multi-day run on all of them, so the question is both "does each node pass?"
and "is any node not like the others?". Facts are read from each node's env section (versions,
driver, GPUs, where the caches live, hazards set, the recompile limit); checks by their names in
each node's sections. Where most nodes agree, the odd node out is named with what differs from the
majority; where there is no majority, every value is named.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge
from dflashdoctor.report import CheckStatus, Finding, ProbeResult, Report, Table

_MARKS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "info": "INFO", "skip": "SKIP"}
# A node's whole report as one check of the nodes section: an error there is that node failing.
_NODE_CHECK: dict[str, CheckStatus] = {"pass": "pass", "fail": "fail", "error": "fail", "skipped": "skip"}
_FIX_STACK = (
    "Give every node the same software (one container image or one lock file) and driver; a node that "
    "differs compiles other kernels, reads other caches, or fails where the others pass."
)


@dataclass
class NodeOutcome:
    """One node's part: its own gate report, or why none could be had."""

    name: str
    report: Report | None = None
    error: str | None = None
    duration_s: float = 0.0


def _env(report: Report) -> dict[str, Any]:
    section = next((r for r in report.results if r.probe == "env"), None)
    return section.measurements if section is not None else {}


def _gpus(env: dict[str, Any]) -> str:
    names = Counter(str(gpu.get("name")) for gpu in env.get("gpus") or [])
    return ", ".join(f"{count} x {name}" for name, count in sorted(names.items())) or "none"


def _hazards(report: Report) -> str:
    variables = sorted(
        str(f.evidence.get("variable"))
        for r in report.results
        if r.probe == "env"
        for f in r.findings
        if f.code == "env-hazard"
    )
    return ", ".join(variables) or "none"


def _filesystems(env: dict[str, Any]) -> str:
    return ", ".join(f"{r.get('kind')} on {r.get('filesystem') or '?'}" for r in env.get("cache_roots") or []) or "?"


def _package(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda env: str((env.get("packages") or {}).get(name) or "not installed")


# fact -> how it is read from a node's env measurements (the report, for hazards)
_FACTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "python": lambda env: str(env.get("python")),
    "torch": lambda env: str(env.get("torch") or "not installed"),
    "triton": _package("triton"),
    "transformers": _package("transformers"),
    "fla-core": _package("fla-core"),
    "driver": lambda env: str(env.get("driver") or "none"),
    "GPUs": _gpus,
    "cache filesystems": _filesystems,
    "recompile limit": lambda env: str(env.get("recompile_limit")),
}


def node_facts(report: Report) -> dict[str, str]:
    """What must match across nodes, as text; empty when the node's gate had no env section."""
    env = _env(report)
    if not env:
        return {}
    facts = {name: read(env) for name, read in _FACTS.items()}
    facts["hazards set"] = _hazards(report)
    return facts


_PROCESS_ID = re.compile(r"^(?:(rank \d+) \(pid \d+\)|(launcher|process) \d+)$")


def _check_key(probe: str, check: str) -> str:
    """A check's name across nodes: a cache root's check is named with its path, and a process's
    section (under `run`) with its pid, which differ."""
    process = _PROCESS_ID.match(probe)
    if process is not None:
        probe = process[1] or process[2]
    return f"{probe}: {check.split()[0] if probe == 'cache' else check}"


def node_checks(report: Report) -> dict[str, str]:
    statuses: dict[str, str] = {}
    for result in report.results:
        for check in result.checks:
            statuses.setdefault(_check_key(result.probe, check.name), check.status)
    return statuses


SLOW_RATIO = 1.5  # a node whose median step takes this many times the others' median is named


@dataclass
class NodeRun:
    """What the gate's `run` section saw on one node, as the nodes are compared."""

    status: str  # the worst of the run's sections (its overview and each process): pass, fail, error
    steps: int  # optimizer steps, summed over the processes
    step_seconds: float | None  # median over the processes' median step times
    dense_sites: list[str]  # `file:line` of each flex_attention site that ran its dense kernel


def node_run(report: Report) -> NodeRun | None:
    """The run's facts from a node's sections; None where the gate ran no `run`. Process sections are
    told by what run's judge measures in each (a pid and a median step time)."""
    overview = next((r for r in report.results if r.probe == "run"), None)
    if overview is None:
        return None
    processes = [r for r in report.results if "pid" in r.measurements and "step_seconds_median" in r.measurements]
    medians = [r.measurements["step_seconds_median"] for r in processes]
    medians = [m for m in medians if type(m) in (int, float) and math.isfinite(m) and m > 0]
    dense = [
        f"{site.get('file')}:{site.get('line')}"
        for r in processes
        for site in r.measurements.get("call_sites") or []
        if isinstance(site, dict) and (site.get("dense_forward") or site.get("dense_backward"))
    ]
    statuses = {overview.status, *(r.status for r in processes)}
    return NodeRun(
        status=next((s for s in ("error", "fail") if s in statuses), "pass"),
        steps=sum(r.measurements["steps"] for r in processes if type(r.measurements.get("steps")) is int),
        step_seconds=statistics.median(medians) if medians else None,
        dense_sites=list(dict.fromkeys(dense)),
    )


def _odd_ones(values: dict[str, str]) -> tuple[str | None, dict[str, str]]:
    """The majority value (None without one) and the nodes that differ from it (all, without one)."""
    counts = Counter(values.values())
    top, top_count = counts.most_common(1)[0]
    if top_count * 2 > len(values):
        return top, {node: value for node, value in values.items() if value != top}
    return None, dict(values)


def _differs(subject: str, values: dict[str, str], evidence_key: str) -> Finding | None:
    if len(set(values.values())) <= 1:
        return None
    majority, odd = _odd_ones(values)
    if majority is not None:
        others = len(values) - len(odd)
        title = f"{subject} differs on {', '.join(odd)}: " + "; ".join(
            f"{value} on {node}" for node, value in odd.items()
        )
        detail = f"The other {others} nodes have {majority}."
    else:
        by_value: dict[str, list[str]] = {}
        for node, value in values.items():
            by_value.setdefault(value, []).append(node)
        title = f"{subject} differs across nodes, with no majority"
        detail = "; ".join(f"{value} on {', '.join(nodes)}" for value, nodes in by_value.items()) + "."
    return finding(
        "node-mismatch",
        title,
        detail=detail,
        evidence={evidence_key: subject, "values": values, "majority": majority, "odd_nodes": list(odd)},
        fix=_FIX_STACK,
    )


class NodesJudge(Judge):
    def __init__(self, outcomes: list[NodeOutcome]) -> None:
        super().__init__("nodes", Budgets())
        self.outcomes = outcomes
        self.reached = [o for o in outcomes if o.report is not None]

    def judge(self) -> ProbeResult:
        for outcome in self.outcomes:
            self._node(outcome)
        facts = {o.name: node_facts(o.report) for o in self.reached if o.report is not None}
        facts = {node: f for node, f in facts.items() if f}
        checks = {o.name: node_checks(o.report) for o in self.reached if o.report is not None}
        self._facts(facts)
        self._checks_across(checks)
        runs = {o.name: node_run(o.report) for o in self.reached if o.report is not None}
        self._runs({node: run for node, run in runs.items() if run is not None})
        self.subject = f"{len(self.outcomes)} nodes"
        self.measurements.update(
            nodes=[o.name for o in self.outcomes], unreachable=[o.name for o in self.outcomes if o.report is None]
        )
        return self.result()

    def _node(self, outcome: NodeOutcome) -> None:
        if outcome.report is None:
            self.findings.append(
                finding(
                    "node-unreachable",
                    f"{outcome.name}: the gate could not run there",
                    detail=f"{outcome.error} The other nodes were gated; this one says nothing about itself.",
                    evidence={"node": outcome.name, "error": outcome.error},
                    fix="Check that `ssh` reaches the node without a password (BatchMode) and that its "
                    "python (the hostfile's python=, or --python, else python3 there) has torch.",
                )
            )
            self._check(outcome.name, "fail", f"unreachable: {outcome.error}", "node-unreachable")
            return
        report = outcome.report
        tally = Counter(r.status for r in report.results)
        summary = ", ".join(f"{n} {status}" for status, n in sorted(tally.items()))
        status = _NODE_CHECK[report.verdict]
        self._check(outcome.name, status, f"{report.verdict} in {outcome.duration_s:.1f} s: {summary}")

    def _facts(self, facts: dict[str, dict[str, str]]) -> None:
        if not facts:
            return
        names = list(next(iter(facts.values())))
        nodes = list(facts)
        self.tables.append(
            Table(
                title="facts across nodes",
                columns=["fact", *nodes],
                rows=[[name, *(facts[node].get(name, "?") for node in nodes)] for name in names],
            )
        )
        differing = []
        for name in names:
            found = _differs(name, {node: f[name] for node, f in facts.items() if name in f}, "fact")
            if found is not None:
                self.findings.append(found)
                differing.append(name)
        summary = f"differ: {', '.join(differing)}" if differing else f"{len(names)} facts alike on {len(nodes)} nodes"
        self._check("facts", "fail" if differing else "pass", summary, "node-mismatch")

    def _checks_across(self, checks: dict[str, dict[str, str]]) -> None:
        if not checks:
            return
        nodes = list(checks)
        keys = list(dict.fromkeys(key for statuses in checks.values() for key in statuses))
        self.tables.append(
            Table(
                title="checks across nodes",
                columns=["check", *nodes],
                rows=[[key, *(_MARKS.get(checks[node].get(key, ""), "-") for node in nodes)] for key in keys],
            )
        )
        differing = []
        for key in keys:
            found = _differs(f"check `{key}`", {node: checks[node].get(key, "absent") for node in nodes}, "check")
            if found is not None:
                self.findings.append(found)
                differing.append(key)
        summary = f"{len(differing)} of {len(keys)} checks differ" if differing else f"{len(keys)} checks alike"
        self._check("checks", "fail" if differing else "pass", summary, "node-mismatch")

    def _runs(self, runs: dict[str, NodeRun]) -> None:
        """The smoke of the team's command on each node, side by side: a site dense on some nodes only
        (another stack or cache there) and a node far slower than the others are named; a run that
        failed on some nodes only is already a differing check."""
        if not runs:
            return
        self.tables.append(
            Table(
                title="run across nodes",
                columns=["node", "run", "optimizer steps", "median step (s)", "sites run dense"],
                rows=[
                    [
                        node,
                        _MARKS.get(run.status, run.status.upper()),
                        str(run.steps),
                        f"{run.step_seconds:.4g}" if run.step_seconds is not None else "-",
                        ", ".join(run.dense_sites) or "none",
                    ]
                    for node, run in runs.items()
                ],
            )
        )
        before = len(self.findings)
        named = self._dense_on_some(runs) + self._slow(runs)
        severities = {f.severity for f in self.findings[before:]}
        status: CheckStatus = "fail" if "error" in severities else "warn" if severities else "pass"
        timed = sum(1 for run in runs.values() if run.step_seconds is not None)
        summary = "; ".join(named) if named else f"{len(runs)} nodes ran it alike ({timed} timed)"
        self._check("run", status, summary, "node-mismatch", "node-slow-steps")

    def _dense_on_some(self, runs: dict[str, NodeRun]) -> list[str]:
        sites = list(dict.fromkeys(site for run in runs.values() for site in run.dense_sites))
        named = []
        for site in sites:
            dense = [node for node, run in runs.items() if site in run.dense_sites]
            if len(dense) == len(runs):
                continue  # dense everywhere: each node's own section says so
            fused = [node for node in runs if node not in dense]
            self.findings.append(
                finding(
                    "node-mismatch",
                    f"flex_attention at {site} ran its dense kernel on {', '.join(dense)} only",
                    detail=f"The same command ran it fused on {', '.join(fused)}. Something differs on "
                    f"{', '.join(dense)}: its torch, its compile caches or a variable set there.",
                    evidence={"site": site, "dense_on": dense, "fused_on": fused},
                    fix=_FIX_STACK,
                )
            )
            named.append(f"{site} dense on {', '.join(dense)} only")
        return named

    def _slow(self, runs: dict[str, NodeRun]) -> list[str]:
        timed = {node: run.step_seconds for node, run in runs.items() if run.step_seconds is not None}
        named = []
        for node, seconds in timed.items():
            others = [s for other, s in timed.items() if other != node]
            if not others or seconds <= SLOW_RATIO * statistics.median(others):
                continue
            typical = statistics.median(others)
            ratio = seconds / typical
            self.findings.append(
                finding(
                    "node-slow-steps",
                    f"{node} takes {ratio:.1f}x the others' time per optimizer step: {seconds:.4g} s "
                    f"against {typical:.4g} s",
                    detail=f"Median seconds per optimizer step under `run`, {len(others)} other nodes' median beside "
                    "it. In data-parallel training every step waits for the slowest node, so the whole run "
                    "would go at this node's pace.",
                    evidence={"node": node, "step_seconds": seconds, "others_step_seconds": typical, "ratio": ratio},
                    fix=f"Look at what differs on {node}: its GPUs' clocks and temperature (nvidia-smi -q), other "
                    "jobs on it, its caches (a cold or network cache compiles every step), its CPU binding.",
                )
            )
            named.append(f"{node} {ratio:.1f}x slower")
        return named


def judge(outcomes: list[NodeOutcome]) -> ProbeResult:
    return NodesJudge(outcomes).judge()
