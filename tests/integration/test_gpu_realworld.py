"""The real-code cases on a GPU, forward and backward at a training shape: every dense layer named
with its cause, both directions charged to their layers (an aot_eager backward graph too), the
ground truth from torch.profiler in a process of its own; and a kernel that does not fit the GPU.

Run on a CUDA machine with `python -m pytest -m gpu`; DFLASHDOCTOR_EVIDENCE_DIR keeps the reports.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import run_cli
from tests.paths import ROOT, TARGETS

pytestmark = pytest.mark.gpu
CASES_DIR = ROOT / "tests" / "realworld"
TRAIN = ("--device", "cuda", "--train", "--seq", "2048", "--layers", "4")
LAYERS = [f"model.layers.{i}.self_attn" for i in range(4)]


def _truth(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(CASES_DIR / "ground_truth.py"), *args], capture_output=True, text=True, cwd=CASES_DIR
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rows(report: dict) -> list[dict]:
    (result,) = report["results"]
    return [r for r in result["measurements"]["call_sites"] if r["impl"] == "flex_attention"]


def test_a_model_compiled_with_aot_eager_is_dense_both_ways_at_every_layer(evidence):
    args = ("hf_llama_compiled.py", "--backend", "aot_eager", *TRAIN)
    truth = _truth(*args)
    run = run_cli(evidence, "trace-attention", "--script", str(CASES_DIR / args[0]), "--", *args[1:])
    assert run.code == 1, run.stdout + run.stderr
    rows = _rows(run.report)
    assert sorted(r["module"] for r in rows) == LAYERS
    assert sum(r["dense_forward"] for r in rows) == truth["dense_forwards"] > 0
    assert all(r["dense_forward"] == 2 and r["dense_backward"] == 2 for r in rows)  # two steps, each layer
    assert {r["cause_kind"] for r in rows} == {"model-backend"}
    titles = [f["title"] for f in run.findings()]
    assert not [t for t in titles if "no recorder saw" in t], titles
    for found in run.findings("dense-backward"):
        assert "backend='aot_eager'" in found["fix"] and "does not help" in found["fix"]


def test_static_shapes_on_a_growing_length_name_the_dynamic_false_line(evidence):
    # On an H200 (torch 2.11) five lengths hit the limit on the model's frame only: transformers'
    # compiled flex, under the same static shapes, needs more lengths after that to hit its own.
    args = ("hf_llama_compiled.py", "--static", "--grow", "--lengths", "10", *TRAIN)
    run = run_cli(evidence, "trace-attention", "--script", str(CASES_DIR / args[0]), "--", *args[1:])
    assert run.code == 1, run.stdout + run.stderr
    dense = [r for r in _rows(run.report) if r["dense_forward"] or r["dense_backward"]]
    assert sorted(r["module"] for r in dense) == LAYERS
    assert {r["cause_kind"] for r in dense} == {"recompile-limit-static-shapes"}
    assert all("dynamic=False" in f["fix"] for f in run.findings("dense-forward"))


def test_the_rebound_wrapper_names_the_rebinding_line(evidence):
    run = run_cli(
        evidence,
        "trace-attention",
        "--script",
        str(CASES_DIR / "titan_rebound.py"),
        "--",
        "--rebind",
        "--device",
        "cuda",
    )
    assert run.code == 1, run.stdout + run.stderr
    dense = [r for r in _rows(run.report) if r["dense_forward"]]
    assert sorted(r["module"] for r in dense) == ["layers.0.attention", "layers.1.attention"]
    assert {r["cause_kind"] for r in dense} == {"rebound-wrapper"}


def test_tiles_larger_than_shared_memory_are_their_own_finding(evidence):
    target = f"{TARGETS / 'oversized_tiles.py'}:too_large"
    run = run_cli(evidence, "check-compile", target, "--device", "cuda", "--head-dim", "256", "--dtype", "float32")
    assert run.code == 1, run.stdout + run.stderr
    assert "target-raised" not in run.codes()
    (refused,) = run.findings("kernel-out-of-resources")
    assert refused["evidence"]["resource"] == "shared memory"
    assert refused["evidence"]["required"] > refused["evidence"]["limit"] > 0
    assert "kernel_options" in refused["fix"]
