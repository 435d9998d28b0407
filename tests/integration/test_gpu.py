"""check-compile and trace-attention on a real GPU: fused forward and backward proven, each planted
fault named at its call site.

Run on a CUDA machine with `python -m pytest -m gpu`. With DFLASHDOCTOR_EVIDENCE_DIR set, each
test keeps its report directory there under the test's name (how reports/examples/ is made).
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import run_cli
from tests.paths import eager_wrapper_cause, eager_wrapper_compiled_at

pytestmark = pytest.mark.gpu
FAULTS = "dflashdoctor.reference.faults"
ENTRY = "flex_attention_forward"


@pytest.fixture
def gpu_cli(evidence):
    def invoke(*args: str):
        return run_cli(evidence, "check-compile", "--device", "cuda", *args)

    return invoke


@pytest.fixture
def trace(evidence):
    def invoke(*args: str):
        return run_cli(evidence, "trace-attention", "--device", "cuda", *args)

    return invoke


def test_healthy_default_is_fused_forward_and_backward(gpu_cli):
    run = gpu_cli()
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    assert measurements["shape"]["q_len"] == 2048 and measurements["shape"]["kv_len"] == 10240
    assert run.check("forward")["status"] == "pass"
    assert run.check("backward")["status"] == "pass"
    assert measurements["dense_forward_calls"] == measurements["dense_backward_calls"] == 0
    assert measurements["bwd_dense_over_fused"] > 100
    assert run.check("numerics")["status"] == "pass"
    assert run.codes() == set()


def test_raw_call_runs_dense_forward_and_backward(gpu_cli):
    run = gpu_cli(f"{FAULTS}.raw_call:{ENTRY}")
    assert run.code == 1
    assert {"dense-forward", "dense-backward", "score-matrix-materialized"} <= run.codes()
    (dense,) = run.findings("dense-forward")
    assert dense["where"]["file"].endswith("raw_call.py")
    measurements = run.report["results"][0]["measurements"]
    assert measurements["bwd_peak_bytes"] > 2**33  # the dense backward: over 8 GiB at this shape


def test_rebound_wrapper_is_not_compiled(gpu_cli):
    run = gpu_cli(f"{FAULTS}.rebound:{ENTRY}", "--vary", "0")
    assert {"not-compiled", "dense-forward", "dense-backward"} <= run.codes()


def test_global_int_hits_recompile_limit(gpu_cli):
    run = gpu_cli(f"{FAULTS}.global_length:{ENTRY}", "--vary", "12", "--q-len", "512", "--kv-len", "2560")
    (fallback,) = run.findings("recompile-limit-fallback")
    assert "valid_kv_len" in fallback["evidence"]["guard"]
    assert fallback["evidence"]["dense_backward_calls"] >= 1


def test_retried_call_poisons_the_frame(gpu_cli):
    run = gpu_cli(f"{FAULTS}.retried_call:{ENTRY}", "--vary", "2")
    (skip,) = run.findings("dynamo-skip-fallback")
    assert "ValueError" in skip["evidence"]["exception"]
    assert skip["evidence"]["dense_backward_calls"] >= 1


def test_dense_call_out_of_memory_is_a_finding(gpu_cli):
    # One dense score matrix here is 32 x 2048 x 1M x 4 bytes = 256 GiB: far past any GPU.
    run = gpu_cli(f"{FAULTS}.raw_call:{ENTRY}", "--kv-len", "1048576", "--mask", "none", "--vary", "1")
    assert run.code == 1
    (oom,) = run.findings("oom")
    assert oom["evidence"]["first"]["phase"] == "target:first"
    assert oom["evidence"]["first"]["last_dense_events"][-1]["kv_shape"][2] == 1048576
    assert "dense-forward" in run.codes()


DRAFTER_SITES = [f"layers.{i}.self_attn" for i in range(5)]
DRAFTER_WRAPPER = "dflashdoctor.reference.drafter:_compiled_flex_attention"


def _drafter_sites(run) -> list[dict]:
    sites = run.report["results"][0]["measurements"]["call_sites"]
    return [s for s in sites if s["module"] in DRAFTER_SITES]


def test_trace_qwen27b_full_scale_runs_the_real_target(trace):
    """The frozen 27B target, as DFlash runs it: forward only, by default."""
    run = trace("--model", "qwen27b", "--scale", "full", "--seq-len", "512")
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    assert measurements["parameters"] > 25e9 and measurements["scale"] == "full"
    assert measurements["backward"] is False
    layers = measurements["layers"]
    assert len(layers) == 64 and all(layer["ran"] for layer in layers)
    full = [layer for layer in layers if layer["kind"] == "full_attention"]
    assert [layer["module"] for layer in full] == [f"model.layers.{i}.self_attn" for i in range(3, 64, 4)]
    assert {layer["impl"] for layer in full} == {"sdpa"}
    linear_impl = "fla kernel" if importlib.util.find_spec("fla") else "torch fallback"
    assert {layer["impl"] for layer in layers if layer["kind"] == "linear_attention"} == {linear_impl}
    assert "flex-unsupported-model" in run.codes()


def _refusing_guards(function: str) -> list:
    """The installed FLA's guards that refuse `function` on this machine (none without FLA)."""
    from dflashdoctor.fla_guards import fla_flags, fla_folder, fla_guards

    if fla_folder() is None:
        return []
    return [guard for guard in fla_guards(fla_flags()[1]) if guard.function == function and guard.applies]


def test_trace_qwen27b_backward_that_fla_refuses_is_an_environment_finding(trace):
    """With --backward the gated DeltaNet layers' backward runs FLA's chunk_bwd_dqkwg, which fla-core
    0.6.0 refuses on Hopper with triton >= 3.4.0 and < 3.7.1: where FLA's own guard holds, the report
    names it (kernel-unavailable), never target-raised, and keeps every layer of the forward."""
    run = trace("--model", "qwen27b", "--scale", "tiny", "--backward")
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    assert measurements["backward"] is True and "target-raised" not in run.codes()
    assert all(layer["ran"] for layer in measurements["layers"])
    refusing = _refusing_guards("chunk_bwd_dqkwg")
    if not refusing:  # this FLA, triton and GPU run the backward
        assert "kernel-unavailable" not in run.codes()
        return
    (refusal,) = run.findings("kernel-unavailable")
    assert "`chunk_bwd_dqkwg`" in refusal["title"] and refusal["where"]["line"] == refusing[0].line
    assert refusal["evidence"]["guard"]["flags"] == refusing[0].flags
    assert run.check("model step")["status"] == "warn"


def test_trace_drafter_step_is_fused_forward_and_backward(trace):
    run = trace("--model", "qwen27b", "--scale", "tiny", "--drafter", "--expect-wrapper", DRAFTER_WRAPPER)
    assert run.code == 0, run.stdout + run.stderr
    assert run.report["results"][0]["measurements"]["drafter"]["backward"] is True
    sites = _drafter_sites(run)
    assert [s["module"] for s in sites] == DRAFTER_SITES
    assert all(s["verdict"] == "fused" and s["dense_backward"] == 0 for s in sites)
    assert not {"dense-forward", "dense-backward", "bypasses-wrapper"} & run.codes()


def test_trace_drafter_on_hf_flex_path_bypasses_the_wrapper(trace):
    run = trace(
        *("--model", "qwen27b", "--scale", "tiny", "--drafter", "--drafter-fault", "hf-flex-path"),
        *("--expect-wrapper", DRAFTER_WRAPPER),
    )
    assert run.code == 1
    (bypass,) = run.findings("bypasses-wrapper")
    assert [s["module"] for s in bypass["evidence"]["sites"]] == DRAFTER_SITES
    assert not {"dense-forward", "dense-backward"} & run.codes()  # HF's singleton is compiled: fused both ways


def test_trace_drafter_eager_wrapper_is_dense_backward_at_each_module(trace):
    run = trace("--model", "qwen27b", "--scale", "tiny", "--drafter", "--drafter-fault", "eager-wrapper")
    assert run.code == 1
    assert [f["where"]["module"] for f in run.findings("dense-forward")] == DRAFTER_SITES
    backward = run.findings("dense-backward")
    assert [f["where"]["module"] for f in backward] == DRAFTER_SITES  # charged to the forward call sites
    # the cause names the wrapper's own torch.compile line, which trace-attention recorded
    compiled_at = eager_wrapper_compiled_at()
    wrapper_cause = eager_wrapper_cause(compiled_at)
    for dense in backward:
        site = dense["evidence"]
        assert site["dense_backward"] == 1 and site["cause"] == wrapper_cause
        assert dense["fix"].endswith(f"at {compiled_at} without `backend='eager'`.")
        assert site["dense_backward_peak_bytes"] >= site["score_matrix_bytes"] > 0
        assert "raised CUDA memory by" in dense["detail"]


def test_trace_hf_flex_model_training_step_is_fused_both_ways(trace):
    run = trace("--model", "qwen3", "--scale", "tiny", "--steps", "2")
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    assert measurements["backward"] is True
    sites = measurements["call_sites"]
    assert [s["module"] for s in sites] == [f"model.layers.{i}.self_attn" for i in range(4)]
    assert all(s["verdict"] == "fused" and s["calls"] == 2 and s["training"] for s in sites)
    assert not {"dense-forward", "dense-backward"} & run.codes()
