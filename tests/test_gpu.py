"""check-compile on a real GPU: fused forward and backward proven, each planted fault named.

Run on a CUDA machine with `python -m pytest -m gpu`. With DFLASHDOCTOR_EVIDENCE_DIR set, each
test keeps its report directory there under the test's name (how reports/examples/ is made).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.gpu
FAULTS = "dflashdoctor.reference.faults"
ENTRY = "flex_attention_forward"


@pytest.fixture
def gpu_cli(request, tmp_path):
    evidence = os.environ.get("DFLASHDOCTOR_EVIDENCE_DIR")
    base = Path(evidence) / request.node.name.removeprefix("test_") if evidence else tmp_path
    base.mkdir(parents=True, exist_ok=True)

    def invoke(*args: str):
        return run_cli(base, "check-compile", "--device", "cuda", *args)

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


def _trace(tmp_path, *args: str):
    return run_cli(tmp_path, "trace-attention", "--device", "cuda", "--scale", "tiny", *args)


def test_trace_drafter_step_is_fused_forward_and_backward(tmp_path):
    run = _trace(tmp_path, "--model", "qwen27b", "--drafter")
    assert run.code == 0, run.stdout + run.stderr
    assert run.report["results"][0]["measurements"]["drafter"]["backward"] is True
    sites = [s for s in run.report["results"][0]["measurements"]["call_sites"] if s["module"].startswith("layers.")]
    assert len(sites) == 5 and all(s["verdict"] == "fused" for s in sites)
    assert "dense-backward" not in run.codes()


def test_trace_drafter_eager_wrapper_is_dense_forward_and_backward(tmp_path):
    run = _trace(tmp_path, "--model", "qwen27b", "--drafter", "--drafter-fault", "eager-wrapper")
    assert run.code == 1
    assert len(run.findings("dense-forward")) == 5
    (backward,) = run.findings("dense-backward")
    assert backward["evidence"]["dense_backward_calls"] == 5
