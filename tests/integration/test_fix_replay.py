"""The fix proven on the user's own call: trace-attention replays one recorded call of each dense
site through torch.compile(flex_attention) after the traced run (hooks/fix_replay.py), real torch,
real flex_attention, and says in the dense finding whether the fix held there."""

from __future__ import annotations

import pytest
import torch

from dflashdoctor.hooks.fix_replay import CapturedCall, FixReplay, TensorSpec
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.observations import DenseEvent
from tests.conftest import run_cli
from tests.paths import ROOT, TARGETS

TITAN = ROOT / "tests" / "realworld" / "titan_rebound.py"
SCRIPT = TARGETS / "fix_replay.py"


def test_a_rebound_wrapper_is_proven_fused_on_its_own_call(cli_here):
    """torchtitan's wrapper rebound to the raw flex_attention: each layer's call, replayed compiled,
    runs no dense kernel and matches the dense result."""
    run = cli_here("trace-attention", "--script", str(TITAN), "--", "--rebind")
    assert run.code == 1, run.stdout + run.stderr
    dense = run.findings("dense-forward")
    assert sorted(f["where"]["module"] for f in dense) == ["layers.0.attention", "layers.1.attention"]
    for found in dense:
        assert "fix proven on this call: fused (0 dense kernels)" in found["detail"], found["detail"]
        replay = found["evidence"]["fix_replay"]
        assert replay["proven"] and replay["dense_kernels"] == 0 and replay["max_abs_diff"] < 1e-3
    # the two layers' calls are alike (shapes and mods): one replay, said for both
    assert [f["evidence"]["fix_replay"]["replayed_as"] for f in dense] == [None, "layers.0.attention"]
    replays = run.report["results"][0]["measurements"]["fix_replays"]
    assert len(replays) == 2 and all(r["device"] == "cpu" and not r["backward"] for r in replays)


def test_a_score_mod_dynamo_cannot_trace_is_not_proven(cli_here):
    """A score_mod with a Python side effect, run under flex_attention's compile-debug switch: the
    dense call works, but the compiled one cannot put the score_mod in a graph and runs dense too."""
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "--debug-score-mod")
    assert run.code == 1, run.stdout + run.stderr
    (dense,) = run.findings("dense-forward")
    assert "fix not proven: " in dense["detail"] and "fix proven" not in dense["detail"], dense["detail"]
    assert not dense["evidence"]["fix_replay"]["proven"]


def _captured(**changes) -> CapturedCall:
    event = DenseEvent("forward", "script", [1, 2, 128, 16], [1, 2, 128, 16], "float32", "cpu", 131072, None)
    spec = TensorSpec((1, 2, 128, 16), (4096, 2048, 16, 1), torch.float32, torch.device("cpu"), False)
    return CapturedCall(event, tensors=(spec, spec, spec), **changes)


def test_mods_closing_over_tensors_on_another_device_are_not_replayed():
    recorder = DenseFlexRecorder()
    replay = FixReplay(recorder)
    replay.calls[("a.py", 1, None)] = _captured(score_buffers=(torch.zeros(2, device="meta"),))
    replay.calls[("a.py", 2, None)] = _captured(problem="its inputs are FakeTensor, not plain tensors")
    with recorder:
        first, second = replay.replay()
    assert (
        not first["proven"]
        and first["reason"] == "the score_mod closes over a tensor on meta while the call ran on cpu"
    )
    assert not second["proven"] and second["reason"] == "its inputs are FakeTensor, not plain tensors"
    assert recorder.events == []  # nothing ran


@pytest.mark.gpu
def test_on_a_gpu_the_fused_call_peaks_below_the_dense_one(evidence):
    """A raw flex_attention call with its backward at 2048 tokens on CUDA: replayed dense and fused,
    forward and backward, each peak measured over what was allocated before it."""
    run = run_cli(
        evidence, "trace-attention", "--script", str(SCRIPT), "--", "--device", "cuda", "--seq", "2048", "--backward"
    )
    assert run.code == 1, run.stdout + run.stderr
    (dense,) = run.findings("dense-forward")
    replay = dense["evidence"]["fix_replay"]
    assert replay["proven"] and replay["backward"] and replay["dense_kernels"] == 0, replay
    assert replay["dense_peak_bytes"] > replay["fused_peak_bytes"] > 0, replay
    assert "fix proven on this call: fused (0 dense kernels), forward/backward peak" in dense["detail"]
    (backward,) = run.findings("dense-backward")
    assert "fix proven on this call" in backward["detail"]


def test_a_replay_past_its_time_is_not_proven():
    recorder = DenseFlexRecorder()
    replay = FixReplay(recorder)
    replay.calls[("a.py", 1, None)] = _captured()
    with recorder:
        (record,) = replay.replay(budget_s=0)
    assert not record["proven"] and record["reason"] == "not replayed: the replays' 0 s were spent"
