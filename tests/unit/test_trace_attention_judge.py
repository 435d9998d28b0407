"""trace-attention's judge on recorded observations: call sites, their verdicts and causes."""

from __future__ import annotations

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.judges.trace_attention import fix_replay_text
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


def test_each_dense_site_says_whether_the_fix_was_proven_on_its_own_call():
    """tests/targets/fix_replay.py on this CPU: one call of each dense site replayed through
    torch.compile(flex_attention) after the run; the float32 one fused, the float64 one refused by
    Inductor's CPU kernel. Proven only where the replay ran with no dense kernel."""
    (result,) = judged("cpu/trace-fix-replay")
    dense = {f.where.module: f for f in found([result], "dense-forward")}
    assert sorted(dense) == ["float64", "proven"]
    proven, refused = dense["proven"], dense["float64"]
    assert "fix proven on this call: fused (0 dense kernels), forward only" in proven.detail
    assert proven.evidence["fix_replay"]["proven"] and proven.evidence["fix_replay"]["max_abs_diff"] < 1e-3
    assert "fix not proven: the compiled call raised" in refused.detail and "float64" in refused.detail
    assert "fix proven" not in refused.detail and not refused.evidence["fix_replay"]["proven"]
    assert [r["layer"] for r in result.measurements["fix_replays"]] == ["proven", "float64"]
    # the replay's own dense kernel is no call of the user's: no unclaimed dense finding for it
    assert len(dense) == len(found([result], "dense-forward"))


def test_a_replay_is_said_as_it_went():
    proven = judged("cpu/trace-fix-replay")[0].measurements["fix_replays"][0]
    on_gpu = {
        **proven,
        "device": "cuda:0",
        "backward": True,
        "dense_peak_bytes": 16 << 30,
        "fused_peak_bytes": 72 << 20,
    }
    assert fix_replay_text(on_gpu) == (
        "fix proven on this call: fused (0 dense kernels), forward/backward peak 16 GiB -> 72 MiB, max |diff| 5e-07"
    )
    out_of_memory = {**on_gpu, "dense_out_of_memory": True, "dense_peak_bytes": None, "max_abs_diff": None}
    assert "the dense call ran out of memory, the fused one 72 MiB" in fix_replay_text(out_of_memory)
    assert fix_replay_text({**proven, "replayed_as": "layers.0.attention"}).endswith(
        "(the same call, shapes and mods, of layers.0.attention was replayed)"
    )
    timed_out = {**proven, "proven": False, "reason": "replay timed out after 240 s"}
    assert fix_replay_text(timed_out) == "fix not proven: replay timed out after 240 s"
    assert fix_replay_text(None) == "fix not proven: no dense forward call of this site was captured to replay"


def test_observations_from_before_the_replay_say_nothing_of_it():
    results = judged("cpu/realworld-titan-rebound")
    assert all("Replayed through" not in f.detail for f in found(results, "dense-forward"))
    assert "fix_replays" not in results[0].measurements
