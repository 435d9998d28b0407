"""The judge of a gate across nodes, in this process, on node reports from real runs: the three
loopback nodes of tests/integration/test_nodes.py (cpu/gate-nodes.merged-report.json, split back into each
node's own report) and an H200's gate (reports/examples/h200-gate-warm), as a fourth node."""

from __future__ import annotations

import copy
import json

from dflashdoctor.judges.nodes import NodeOutcome, judge, node_checks, node_facts
from dflashdoctor.report import Report
from tests.paths import ROOT
from tests.unit.recorded import ASSETS

CASES = {
    "node-unreachable": "cpu/gate-nodes.merged-report.json (node-d)",
    "node-mismatch": "cpu/gate-nodes.merged-report.json (node-b's environment, node-c's cache), the H200 as a node",
}
RECORDED = ASSETS / "cpu" / "gate-nodes.merged-report.json"


def _nodes() -> dict[str, Report]:
    """The recorded merged report, split into the report each node's own gate made."""
    merged = Report.from_json(RECORDED.read_text(encoding="utf-8"))
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
