"""The judge of a gate across nodes, in this process, on node reports from real runs: the three
loopback nodes of tests/integration/test_nodes.py (cpu/gate-nodes.merged-report.json, split back into each
node's own report), the three of tests/integration/test_nodes_run.py that ran the team's trainer
(cpu/gate-nodes-run.merged-report.json) and an H200's gate (reports/examples/h200-gate-warm), as a
fourth node."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from dflashdoctor.judges.nodes import NodeOutcome, judge, node_checks, node_facts, node_run
from dflashdoctor.report import Report
from tests.paths import ROOT
from tests.unit.recorded import ASSETS

CASES = {
    "node-unreachable": "cpu/gate-nodes.merged-report.json (node-d)",
    "node-mismatch": "cpu/gate-nodes.merged-report.json (node-b's environment, node-c's cache), the H200 as a node; "
    "cpu/gate-nodes-run.merged-report.json (a site dense on node-b only)",
    "node-slow-steps": "cpu/gate-nodes-run.merged-report.json (node-c's steps)",
}
RECORDED = ASSETS / "cpu" / "gate-nodes.merged-report.json"
RECORDED_RUN = ASSETS / "cpu" / "gate-nodes-run.merged-report.json"


def _nodes(recorded: Path = RECORDED) -> dict[str, Report]:
    """The recorded merged report, split into the report each node's own gate made."""
    merged = Report.from_json(recorded.read_text(encoding="utf-8"))
    nodes: dict[str, Report] = {}
    for result in merged.results[1:]:
        name, _, probe = result.probe.partition(": ")
        node = nodes.setdefault(name, Report(command="gate", argv=merged.argv, started=merged.started))
        node.results.append(copy.deepcopy(result))
        node.results[-1].probe = probe
    for node in nodes.values():
        node.settle_verdict()
    return nodes


def _outcomes(**extra: Report | str) -> list[NodeOutcome]:
    outcomes = [NodeOutcome(name, report=report, duration_s=7.0) for name, report in _nodes().items()]
    for name, value in extra.items():
        if isinstance(value, str):
            outcomes.append(NodeOutcome(name, error=value))
        else:
            outcomes.append(NodeOutcome(name, report=value))
    return outcomes


def _mismatches(result) -> dict[str, dict]:
    found = [f for f in result.findings if f.code == "node-mismatch"]
    return {f.evidence.get("fact") or f.evidence.get("check"): f.evidence for f in found}


def test_the_recording_is_judged_again_as_its_run_judged_it():
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))["results"][0]
    again = judge(_outcomes(**{"node-d": "--ssh node-d: ssh: connect to host 127.0.0.1 port 1: Connection refused"}))
    assert [c.name for c in again.checks] == [c["name"] for c in recorded["checks"]]
    assert [c.status for c in again.checks] == [c["status"] for c in recorded["checks"]]
    assert [f.title for f in again.findings if f.code == "node-mismatch"] == [
        f["title"] for f in recorded["findings"] if f["code"] == "node-mismatch"
    ]
    assert again.status == "fail"


def test_the_odd_nodes_are_named_with_what_differs():
    result = judge(_outcomes())
    mismatches = _mismatches(result)
    assert {node for evidence in mismatches.values() for node in evidence["odd_nodes"]} == {"node-b", "node-c"}
    assert mismatches["triton"]["odd_nodes"] == ["node-b"] and mismatches["triton"]["majority"] == "3.9.0"
    assert mismatches["check `cache: triton`"]["values"]["node-c"] == "fail"
    triton = next(f for f in result.findings if f.evidence.get("fact") == "triton")
    assert triton.title == "triton differs on node-b: not installed on node-b"
    assert triton.detail == "The other 2 nodes have 3.9.0." and triton.severity == "error"


def test_an_unreachable_node_is_a_finding_and_the_others_still_count():
    result = judge(_outcomes(**{"node-d": "--ssh node-d: ssh: connect to host 127.0.0.1 port 1: Connection refused"}))
    (unreachable,) = [f for f in result.findings if f.code == "node-unreachable"]
    assert unreachable.title == "node-d: the gate could not run there" and "refused" in unreachable.detail
    assert {c.name: c.status for c in result.checks}["node-d"] == "fail"
    assert result.measurements["unreachable"] == ["node-d"]


def test_an_h200_among_cpu_nodes_differs_in_driver_gpus_and_versions():
    h200 = Report.from_json((ROOT / "reports/examples/h200-gate-warm/report.json").read_text(encoding="utf-8"))
    facts = node_facts(h200)
    assert facts["GPUs"] == "1 x NVIDIA H200" and facts["driver"] == "580.159.04" and facts["torch"] == "2.11.0+cu130"
    mismatches = _mismatches(judge(_outcomes(gpu=h200)))
    for fact in ("GPUs", "driver", "torch", "python"):
        assert "gpu" in mismatches[fact]["odd_nodes"], fact
    assert node_checks(h200)["cache: triton"] == "pass"  # a cache check named by its root's path, keyed by its kind


def test_two_against_two_has_no_majority():
    nodes = _nodes()
    outcomes = [
        NodeOutcome("a", report=nodes["node-a"]),
        NodeOutcome("b", report=nodes["node-b"]),
        NodeOutcome("a2", report=nodes["node-a"]),
        NodeOutcome("b2", report=nodes["node-b"]),
    ]
    (triton,) = [f for f in judge(outcomes).findings if f.evidence.get("fact") == "triton"]
    assert triton.title == "triton differs across nodes, with no majority"
    assert triton.detail == "3.9.0 on a, a2; not installed on b, b2."
    assert triton.evidence["majority"] is None


def test_alike_nodes_pass():
    nodes = _nodes()
    result = judge([NodeOutcome("a", report=nodes["node-a"]), NodeOutcome("a2", report=nodes["node-a"])])
    assert result.status == "pass" and not result.findings
    assert {c.name: c.status for c in result.checks} == {"a": "pass", "a2": "pass", "facts": "pass", "checks": "pass"}


def _run_outcomes() -> list[NodeOutcome]:
    return [NodeOutcome(name, report=report, duration_s=20.0) for name, report in _nodes(RECORDED_RUN).items()]


def _with_step_seconds(report: Report, seconds: object) -> Report:
    """The node's report with its trainer's median step time replaced: what another node measured."""
    changed = copy.deepcopy(report)
    for result in changed.results:
        if "step_seconds_median" in result.measurements and "pid" in result.measurements:
            result.measurements["step_seconds_median"] = seconds
    return changed


def test_the_run_recording_is_judged_again_as_its_run_judged_it():
    recorded = json.loads(RECORDED_RUN.read_text(encoding="utf-8"))["results"][0]
    again = judge(_run_outcomes())
    assert [(c.name, c.status) for c in again.checks] == [(c["name"], c["status"]) for c in recorded["checks"]]
    compared = {"facts", "checks", "run"}  # a node's own line holds its wall time, not recorded apart
    assert [c.summary for c in again.checks if c.name in compared] == [
        c["summary"] for c in recorded["checks"] if c["name"] in compared
    ]
    assert [f.title for f in again.findings] == [f["title"] for f in recorded["findings"]]


def test_each_nodes_run_is_read_from_its_sections_and_processes_match_by_rank_not_pid():
    nodes = _nodes(RECORDED_RUN)
    runs = {name: node_run(report) for name, report in nodes.items()}
    assert [runs[n].status for n in ("node-a", "node-b", "node-c")] == ["pass", "fail", "pass"]
    assert all(run.steps == 4 for run in runs.values())
    assert runs["node-b"].dense_sites and not runs["node-a"].dense_sites and not runs["node-c"].dense_sites
    assert runs["node-c"].step_seconds > 0.6  # its planted pause per step
    keys = [set(node_checks(report)) for report in nodes.values()]
    assert keys[0] == keys[1] == keys[2] and "rank 0: flex calls" in keys[0]  # each node's pid differs
    assert node_run(_nodes()["node-a"]) is None  # a gate without `run`


def test_the_dense_site_and_the_slow_node_are_named():
    result = judge(_run_outcomes())
    (dense,) = [f for f in result.findings if f.code == "node-mismatch" and "site" in f.evidence]
    assert dense.evidence["dense_on"] == ["node-b"] and dense.evidence["fused_on"] == ["node-a", "node-c"]
    assert dense.title.endswith("node_trainer.py:19 ran its dense kernel on node-b only")
    (slow,) = [f for f in result.findings if f.code == "node-slow-steps"]
    assert slow.severity == "warning" and slow.evidence["node"] == "node-c"
    assert slow.title.startswith("node-c takes ") and "x the others' time per optimizer step" in slow.title
    (table,) = [t for t in result.tables if t.title == "run across nodes"]
    assert [row[1] for row in table.rows] == ["PASS", "FAIL", "PASS"]


@pytest.mark.parametrize(
    ("seconds", "named"),
    [(0.03, False), (0.0449, False), (0.0451, True), (5.0, True)],
)
def test_two_nodes_name_the_slower_only_past_one_and_a_half_times(seconds, named):
    nodes = _nodes(RECORDED_RUN)
    a = _with_step_seconds(nodes["node-a"], 0.03)
    outcomes = [NodeOutcome("a", report=a), NodeOutcome("b", report=_with_step_seconds(nodes["node-a"], seconds))]
    result = judge(outcomes)
    slow = [f.evidence["node"] for f in result.findings if f.code == "node-slow-steps"]
    assert slow == (["b"] if named else [])
    assert {c.name: c.status for c in result.checks}["run"] == ("warn" if named else "pass")


@pytest.mark.parametrize("seconds", [None, math.nan, math.inf, -1.0, 0, "0.7", True])
def test_a_step_time_that_is_no_time_is_left_out_never_named(seconds):
    nodes = _nodes(RECORDED_RUN)
    odd = _with_step_seconds(nodes["node-a"], seconds)
    result = judge([NodeOutcome("a", report=nodes["node-a"]), NodeOutcome("odd", report=odd)])
    assert not [f for f in result.findings if f.code == "node-slow-steps"]
    (table,) = [t for t in result.tables if t.title == "run across nodes"]
    assert table.rows[1][3] == "-"
    assert "(1 timed)" in {c.name: c.summary for c in result.checks}["run"]
