"""The cause model on recorded real-code runs (tests/realworld/, recorded by record_probes.py): each
dense site's cause kind, the line it names and a fix that follows the cause, not the symptom."""

from __future__ import annotations

import pytest

from dflashdoctor.judges.dense_cause import CompileCall, DenseCall, explain
from dflashdoctor.judges.raised_cause import explain_raised
from tests.unit.recorded import judged, observations

RECORDED = {
    "cpu/realworld-llama-aot-eager": ("model-backend", "backend='aot_eager'", "hf_llama_compiled.py"),
    "cpu/realworld-llama-static-grow": ("recompile-limit-static-shapes", "dynamic=False", "hf_llama_compiled.py"),
    "cpu/realworld-packed-static": ("recompile-limit-static-shapes", "dynamic=False", "packed_static.py"),
    "cpu/realworld-prefix-lm-global": ("recompile-limit-global", "PREFIX_LENGTH", "prefix_lm_global.py"),
    "cpu/realworld-titan-rebound": ("rebound-wrapper", "Remove the rebinding", "titan_rebound.py"),
}


def _dense_rows(name: str) -> list[dict]:
    (result,) = judged(name)
    rows = result.measurements["call_sites"]
    return [r for r in rows if r["impl"] == "flex_attention" and (r["dense_forward"] or r["dense_backward"])]


@pytest.mark.parametrize("name", RECORDED)
def test_each_recorded_case_gets_its_own_cause_and_fix(name):
    kind, fix_names, script = RECORDED[name]
    (result,) = judged(name)
    rows = _dense_rows(name)
    assert rows and {r["cause_kind"] for r in rows} == {kind}
    names = [r["module"] or r["function"] for r in result.measurements["call_sites"]]
    assert len(names) == len(set(names))  # one layer, one row
    dense = [f for f in result.findings if f.code == "dense-forward"]
    assert len(dense) == len(rows)
    for found in dense:
        assert fix_names in found.fix
        assert f"{script}:" in found.detail.split("The line to change: ")[-1]


def test_a_whole_model_on_aot_eager_is_charged_layer_by_layer_and_not_told_to_use_a_wrapper():
    rows = _dense_rows("cpu/realworld-llama-aot-eager")
    assert sorted(r["module"] for r in rows) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all(r["dense_forward"] == 2 for r in rows)  # two forwards of the script, each layer dense once
    (result,) = judged("cpu/realworld-llama-aot-eager")
    for found in result.findings:
        if found.code == "dense-forward":
            assert "does not help" in found.fix and "Call a wrapper" not in found.fix
        if found.code == "hf-internal-flex-path":
            assert "passes the raw flex_attention to your graph" in found.detail


def test_static_shapes_are_told_apart_from_a_global_number():
    recorded = observations("cpu/realworld-packed-static")
    compiles = recorded.compiles
    calls = CompileCall.read(recorded.traced_script["compile_calls"])
    static = explain(DenseCall(route="compiled-eager"), compiles, calls)
    assert static.kind == "recompile-limit-static-shapes" and "capture them as tensors" not in static.fix
    assert static.where is not None and static.where.file.endswith("packed_static.py")
    # without the record of the torch.compile call, the same guard still says what to change
    unnamed = explain(DenseCall(route="compiled-eager"), compiles, [])
    assert unnamed.kind == static.kind and "dynamic=False" in unnamed.fix
    glob = explain(DenseCall(route="compiled-eager"), observations("cpu/realworld-prefix-lm-global").compiles, [])
    assert glob.kind == "recompile-limit-global" and "`PREFIX_LENGTH`" in glob.fix


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (DenseCall(route="raw"), "never-compiled"),
        (DenseCall(route="graph"), "eager-backend"),
        (DenseCall(route="compiled-eager"), "compiled-but-eager"),
        (DenseCall(route=None), "unknown"),
        (DenseCall(route="compiled-eager", wrapper_backend="eager", wrapper_compiled_at="t.py:3"), "wrapper-backend"),
        (DenseCall(route="graph", in_outer_region=True, backend="aot_eager"), "model-backend"),
        (DenseCall(route="raw", rebound={"name": "W.fn", "file": "t.py", "line": 9}), "rebound-wrapper"),
    ],
)
def test_the_route_and_region_decide_without_compile_records(call, kind):
    assert explain(call, [], []).kind == kind


def test_dynamo_disabled_comes_first():
    assert explain(DenseCall(route="raw"), [], [], dynamo_disabled=True).kind == "dynamo-disabled"


def test_a_graph_of_an_eager_flex_wrapper_is_the_wrapper_not_the_model():
    calls = [CompileCall(file="t.py", line=4, target="flex_attention", backend="eager", dynamic=None)]
    cause = explain(DenseCall(route="graph"), [], calls)
    assert cause.kind == "wrapper-backend" and cause.where is not None and cause.where.line == 4


def test_a_recompile_limit_raised_with_no_record_of_its_own_is_read_from_the_guards_before_it():
    """fail_on_recompile_limit_hit raises in the user's frame and leaves no compile record of that
    failure: the cause is the guard the earlier recompiles kept failing (here a module-level
    number), and with no recompile at all, a recompile limit naming no frame."""
    error = {
        "type": "FailOnRecompileLimitHit",
        "message": "recompile limit (8) reached; set torch._dynamo.config.fail_on_recompile_limit_hit = False",
        "traceback": "",
    }
    compiles = observations("cpu/realworld-prefix-lm-global").compiles
    cause = explain_raised(error, compiles, [])
    assert cause is not None and cause.kind == "recompile-limit-global"
    assert "PREFIX_LENGTH" in cause.fix
    bare = explain_raised(error, [], [])
    assert bare is not None and bare.kind == "recompile-limit" and "`?`" in bare.summary
    assert "no recompile reason" in bare.summary and "``" not in bare.summary
