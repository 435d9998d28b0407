"""trace-attention's judge on recorded observations: call sites, their verdicts and causes."""

from __future__ import annotations

import pytest

from dflashdoctor.budgets import Budgets
from tests.unit.recorded import codes, documented, found, judged, judged_case

CASES = {
    "bypasses-wrapper": "cpu/trace-hf-flex-path",
    "hf-internal-flex-path": "cpu/trace-hf-flex-path",
    "flex-unsupported-model": "cpu/trace-qwen27b",
    "kernel-unavailable": "h200/trace-qwen27b-tiny-backward",
    "repeat-kv-expansion": "cpu/trace-six-heads",
    "target-raised": "cpu/trace-script-raises",
    "instrumentation-unavailable": ("cpu/trace-qwen27b", {"hook_unavailable": "no dense-kernel hook on this torch"}),
}


@pytest.mark.parametrize("code", CASES)
def test_each_finding_from_a_recorded_run(code):
    (finding, *_) = documented(judged_case(CASES[code]), code)
    assert finding.title and (finding.fix or code == "instrumentation-unavailable")


def test_the_eager_wrapper_is_dense_at_each_layer_with_its_cause():
    (result,) = judged("cpu/trace-eager-wrapper")
    dense = found([result], "dense-forward")
    assert sorted(f.where.module for f in dense) == [f"layers.{i}.self_attn" for i in range(5)]
    assert all(f.evidence["cause_kind"] == "wrapper-backend" for f in dense)
    assert all("backend='eager'" in f.fix and "torch.compile(flex_attention)" in f.fix for f in dense)
    (table,) = result.tables
    assert table.columns[:4] == ["module", "impl", "calls", "verdict"] and len(table.rows) == 5
    assert {row[3] for row in table.rows} == {"dense despite compile"}


def test_on_the_gpu_the_dense_backward_is_charged_to_its_layer_with_its_memory():
    results = judged("h200/trace-drafter-eager-wrapper")
    backward = found(results, "dense-backward")
    assert len(backward) == 5 and all(f.where.module.startswith("layers.") for f in backward)
    assert all(f.evidence["dense_backward_peak_bytes"] > 0 for f in backward)


def test_fla_refusing_the_backward_on_hopper_is_the_environment_not_the_model():
    (result,) = judged("h200/trace-qwen27b-tiny-backward")
    (refused,) = found([result], "kernel-unavailable")
    assert refused.where.file.endswith(".py") and "target-raised" not in codes([result])
    assert result.status == "pass"


def test_on_a_cpu_fla_layers_run_the_torch_fallback():
    (result,) = judged("cpu/trace-qwen27b")
    layers = result.measurements["layers"]
    assert {layer["impl"] for layer in layers if layer["kind"] == "linear_attention"} == {"torch fallback"}
    assert all(layer["ran"] for layer in layers)


def test_a_script_that_raises_keeps_the_sites_seen_before():
    (result,) = judged("cpu/trace-script-raises")
    (raised,) = found([result], "target-raised")
    assert "Traceback" in raised.evidence["traceback"] and result.measurements["call_sites"]


def test_sites_that_bypass_the_expected_wrapper_are_named():
    (bypass,) = found(judged("cpu/trace-hf-flex-path"), "bypasses-wrapper")
    assert len(bypass.evidence["sites"]) == 5 and bypass.evidence["expected"].endswith(":_compiled_flex_attention")


def test_graph_breaks_over_the_gate_budget_fail_the_section():
    (result,) = judged("cpu/trace-eager-wrapper", graph_breaks={"print": 2}, budgets=Budgets(held_by_gate=True))
    (over,) = found([result], "budget-exceeded")
    assert over.evidence == {"budget": "max_graph_breaks", "limit": 0, "measured": 2, "probe": "trace-attention"}
    (line,) = [c for c in result.checks if "budget-exceeded" in c.codes]  # the graph breaks' own line, failing
    assert line.name == "graph breaks" and line.status == "fail"
