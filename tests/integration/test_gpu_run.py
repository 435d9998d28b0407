"""`dflashdoctor run` on the reference DFlash trainer on a GPU: each fault switch found where it is,
and the healthy trainer clean. With two GPUs the data-parallel pairs sit one per GPU, as in the
original run; with one they share it (the autotuners are shared either way: module globals).

Run on a CUDA machine (`python -m pytest -m gpu tests/integration/test_gpu_run.py`); the autotuner test needs
fla-core. DFLASHDOCTOR_EVIDENCE_DIR keeps every report.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import CliRun, run_cli
from tests.paths import eager_wrapper_cause, eager_wrapper_compiled_at

pytestmark = pytest.mark.gpu
TRAINER = ("--", sys.executable, "-m", "dflashdoctor.reference.trainer")
COLD = {"FLA_CACHE_RESULTS": "0", "TRITON_CACHE_AUTOTUNING": "0"}  # every run tunes, as a first run does


@pytest.fixture
def trainer(evidence):
    def invoke(*args: str, run_options: tuple[str, ...] = ()) -> CliRun:
        return run_cli(evidence, "run", "--hang-timeout", "300", *run_options, *TRAINER, *args, timeout=580, env=COLD)

    return invoke


def _sections(run: CliRun) -> list[dict]:
    return [r for r in run.report["results"][1:] if r["measurements"].get("steps")]


def test_healthy_trainer_is_clean(trainer):
    run = trainer("--steps", "3")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (section,) = _sections(run)
    assert section["measurements"]["steps"] == 3 and section["measurements"]["peak_bytes"] > 0
    sites = [s for s in section["measurements"]["call_sites"] if s["impl"] == "flex_attention"]
    assert sites and all(s["verdict"] == "fused" for s in sites)


def test_eager_wrapper_is_dense_backward_at_the_drafter_modules(trainer):
    run = trainer("--steps", "2", "--fault", "eager-wrapper")
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-3000:]
    backward = run.findings("dense-backward")
    modules = {f["where"]["module"] for f in backward}
    assert modules and all(m.startswith("drafter.layers.") and m.endswith(".self_attn") for m in modules)
    assert all(f["evidence"]["score_matrix_bytes"] > 0 for f in backward)
    compiled_at = eager_wrapper_compiled_at()  # the cause and the fix name the wrapper's own compile line
    assert all(f"Cause: {eager_wrapper_cause(compiled_at)}." in f["detail"] for f in backward)
    assert all(f["fix"].endswith(f"at {compiled_at} without `backend='eager'`.") for f in backward)
    for raised in run.findings("uncaught-exception"):  # two pairs' eager flex calls can trip torch's FX flag
        assert raised["evidence"].get("known_cause") == "fx-tracing-flag", raised["title"]


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs fla-core")
def test_concurrent_target_forwards_are_caught_inside_one_autotuner(trainer):
    run = trainer("--steps", "3", "--fault", "concurrent-target")
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-3000:]
    (entry, *_) = run.findings("concurrent-autotuner-entry")
    overlap = entry["evidence"]["overlaps"][0]
    assert len(overlap["threads"]) == 2 and all(overlap["stacks"])  # both threads, both stacks
    assert entry["where"] is not None
    for raised in run.findings("uncaught-exception"):  # the crash the shared autotuner causes, explained
        assert raised["evidence"].get("known_cause") == "shared-autotuner", raised["title"]


def test_sequential_target_forwards_enter_no_autotuner_together(trainer):
    run = trainer("--steps", "2")
    assert not run.findings("concurrent-autotuner-entry")


def test_out_of_memory_names_the_dense_kernel_and_leaves_a_snapshot(trainer):
    large = ("--steps", "1", "--pairs", "1", "--fault", "eager-wrapper", "--blocks", "128", "--context-len", "524288")
    run = trainer(*large, run_options=("--memory-snapshot",))
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-3000:]
    (oom,) = run.findings("oom")
    assert "dense flex_attention forward kernel" in oom["title"]
    snapshot = oom["evidence"]["allocator"]["memory_snapshot"]
    assert snapshot and Path(snapshot).stat().st_size > 0
    assert oom["evidence"]["allocator"]["requested_bytes"] > 0
    assert run.findings("child-failed")


def test_recompile_prone_mask_falls_back_to_dense(trainer):
    run = trainer("--steps", "11", "--fault", "recompile-mask")
    dense = run.findings("dense-forward") + run.findings("dense-backward")
    assert dense and all("recompile limit" in f["detail"] for f in dense), [f["detail"] for f in dense]
