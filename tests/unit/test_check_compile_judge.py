"""check-compile's judge on recorded observations: each finding it can make, from a real run."""

from __future__ import annotations

import math

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.judges.check_compile import parse_guard
from tests.unit.recorded import codes, documented, found, judged, judged_case

# Each code this judge makes, and a recording that shows it (cpu/: this machine; h200/: an H200).
CASES = {
    "not-compiled": "cpu/check-compile-rebound",
    "dense-forward": "cpu/check-compile-raw-call",
    "dense-backward": "h200/check-compile-raw-call",
    "recompile-limit-fallback": "cpu/check-compile-global-length",
    "dynamo-skip-fallback": "cpu/check-compile-retried-call",
    "recompiles": "cpu/check-compile-recompiles",
    "graph-break": "cpu/check-compile-graph-break",
    "score-matrix-materialized": "h200/check-compile-raw-call",
    "numeric-mismatch": "cpu/check-compile-drift",
    "backward-not-checked": "cpu/check-compile-healthy",
    "target-raised": "cpu/check-compile-raises",
    "oom": "h200/check-compile-oom",
    # variants of a real recording: held to the gate's budgets; a hook that would not install
    "budget-exceeded": ("cpu/check-compile-recompiles", {"budgets": Budgets(max_recompiles=0, held_by_gate=True)}),
    "instrumentation-unavailable": ("cpu/check-compile-raw-call", {"dynamo_watch_unavailable": "no dynamo hook"}),
}


@pytest.mark.parametrize("code", CASES)
def test_each_finding_from_a_recorded_run(code):
    results = judged_case(CASES[code])
    (finding, *_) = documented(results, code)
    assert finding.title and finding.fix
    if finding.severity == "error":
        assert results[0].status == "fail"


def test_a_healthy_cpu_run_passes_with_only_the_backward_note():
    (result,) = judged("cpu/check-compile-healthy")
    assert result.status == "pass" and codes([result]) == {"backward-not-checked"}
    assert result.measurements["dense_forward_calls"] == 0 and result.measurements["shape"]["q_len"] > 0
    assert result.subject.startswith("cpu (cpu) · B") and "mask dflash" in result.subject


def test_a_healthy_gpu_run_is_fused_both_ways_with_memory_compared():
    (result,) = judged("h200/check-compile-healthy")
    assert result.status == "pass" and "backward-not-checked" not in codes([result])
    m = result.measurements
    assert m["fwd_dense_over_fused"] > 10 and m["bwd_dense_over_fused"] > 10  # dense builds the score matrix
    assert [c.title for c in result.comparisons][:2] == ["Forward peak memory", "Backward peak memory"]


def test_the_dense_call_is_named_at_the_line_that_made_it():
    (dense,) = found(judged("cpu/check-compile-raw-call"), "dense-forward")
    assert dense.where.file.endswith("raw_call.py") and dense.where.function == "flex_attention_forward"
    assert dense.evidence["dense_forward_calls"] > 0 and "score matrix" in dense.detail


def test_the_rebinding_line_is_where_not_compiled_points():
    (rebound,) = found(judged("cpu/check-compile-rebound"), "not-compiled")
    assert rebound.where.file.endswith("rebound.py") and "_compiled_flex_attention" in rebound.title


def test_the_recompile_limit_names_the_guard_that_failed():
    (fallback,) = found(judged("cpu/check-compile-global-length"), "recompile-limit-fallback")
    assert fallback.where.file.endswith("global_length.py") and fallback.evidence["guard"]


def test_a_dense_backward_on_the_gpu_says_what_it_cost():
    results = judged("h200/check-compile-raw-call")
    (backward,) = found(results, "dense-backward")
    (memory,) = found(results, "score-matrix-materialized")
    assert backward.evidence["dense_backward_calls"] > 0
    assert memory.evidence["fwd_peak_bytes"] >= memory.evidence["score_matrix_bytes"] / 2


def test_out_of_memory_names_the_phase():
    (oom,) = found(judged("h200/check-compile-oom"), "oom")
    assert oom.evidence["phases"] and "out of memory" in oom.detail.lower()


def test_a_hook_that_would_not_install_is_said_and_the_rest_still_judged():
    why = "torch._higher_order_ops.flex_attention has no dense kernel entry on this torch"
    (result,) = judged("cpu/check-compile-raw-call", hook_unavailable=why)
    (note,) = found([result], "instrumentation-unavailable")
    assert note.detail == why and "dense-forward" in codes([result])


def test_the_gate_holds_a_run_to_its_budgets():
    budgets = Budgets(max_recompiles=0, max_compile_seconds=0.001, held_by_gate=True)
    (result,) = judged("cpu/check-compile-recompiles", budgets=budgets)
    over = {f.evidence["budget"]: f for f in found([result], "budget-exceeded")}
    assert set(over) == {"max_recompiles", "max_compile_seconds"} and result.status == "fail"
    # one fact, one finding, one check line: the overrun takes the recompiles warning's place, with its guards
    assert "recompiles" not in codes([result])
    recompiles = over["max_recompiles"]
    assert "The guards that failed" in recompiles.detail and recompiles.evidence["finding"]["recompile_reasons"]
    lines = {c.name: c for c in result.checks}
    assert "budget max_recompiles" not in lines and lines["varying lengths"].status == "fail"
    assert "budget-exceeded" in lines["varying lengths"].codes
    assert "over the budget max_recompiles = 0" in lines["varying lengths"].summary
    assert lines["budget max_compile_seconds"].status == "fail"  # a figure with no check line of its own
    alone = judged("cpu/check-compile-recompiles", budgets=Budgets(max_recompiles=0))
    assert "budget-exceeded" not in codes(alone) and alone[0].status == "pass"  # a warning, not a budget


def test_a_dense_backward_the_team_accepts_is_no_failure():
    budgets = Budgets(require_fused_backward=False, held_by_gate=True)
    (result,) = judged("h200/check-compile-raw-call", budgets=budgets)
    assert "dense-backward" not in codes([result]) and "dense-forward" in codes([result])
    accepted = [c for c in result.checks if c.summary.startswith("allowed (require_fused_backward = false)")]
    assert all(c.status != "fail" or "dense-forward" in c.codes for c in accepted)


@pytest.mark.parametrize(
    ("reason", "expression"),
    [
        ("L['kv_len'] == 1280", "L['kv_len'] == 1280"),
        ("___check_global_state()\n  whatever", "___check_global_state()"),
        ("", ""),
    ],
)
def test_parse_guard_keeps_the_failed_expression(reason, expression):
    assert parse_guard(reason, None).expression == expression


def test_nan_in_the_numerics_is_a_mismatch_never_a_pass():
    (result,) = judged("cpu/check-compile-healthy", numerics={"out_rel_err": math.nan})
    assert "numeric-mismatch" in codes([result]) and result.status == "fail"
