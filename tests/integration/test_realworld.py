"""Real-code cases (tests/realworld/): the cause, the site and the fix a user would follow, not only
pass/fail. Each faulty case has a healthy twin. The ground truth comes from outside dflashdoctor:
the same script under torch.profiler (the dense kernel's own softmax op) and dynamo's compile records
(tests/realworld/ground_truth.py), in a child process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.paths import ROOT
from tests.realworld.corpus import CASES, LLAMA_LAYERS, Case, findings, flex_rows, score

CASES_DIR = ROOT / "tests" / "realworld"
CPU_CASES = [c for c in CASES if not c.notes.get("gpu_only")]


def _ground_truth(case: Case) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CASES_DIR / "ground_truth.py"), case.script, *case.args],
        capture_output=True,
        text=True,
        cwd=CASES_DIR,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CPU_CASES, ids=[c.id for c in CPU_CASES])
def test_trace_attention_is_right_on_every_dimension(case: Case, cli_here):
    """Verdict, dense sites, cause, fix and the user's line, each against the case's truth; the dense
    kernels the profiler counted in a process of its own are every one charged to a row."""
    truth = _ground_truth(case)
    args = ("--", *case.args) if case.args else ()
    run = cli_here("trace-attention", "--script", str(CASES_DIR / case.script), *args)
    scored = score(case, run.code, run.report)
    assert all(scored.values()), (scored, run.stdout[-3000:], run.stderr[-2000:])
    rows = flex_rows(run.report)
    names = [r["module"] or r["function"] for r in rows]
    assert len(names) == len(set(names)), f"one layer, one row: {names}"
    assert sum(r["dense_forward"] or 0 for r in rows) == truth["dense_forwards"]
    assert not [f for f in findings(run.report, "dense-forward") if "no recorder saw" in f["title"]]
    for row in rows:
        if row["dense_forward"] or row["dense_backward"]:
            assert row["cause"] and "None" not in row["cause"]
    if case.cause and case.cause.startswith("recompile-limit"):
        assert truth["recompile_limit_hits"] >= 1
    for found in findings(run.report, "dense-forward", "dense-backward", "target-raised"):
        assert "site-packages" not in found["fix"], found["fix"]  # a fix never points into a library


RUN_CASES = [c for c in CASES if c.script == "hf_llama_compiled.py"]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c.id for c in RUN_CASES])
def test_run_gives_one_row_per_layer_with_the_same_cause(case: Case, cli_here):
    """Under `run` transformers binds the recorder's stand-in, so a compiled layer is seen by two
    recorders; the process section still lists each layer once, dense layers never fused."""
    run = cli_here("run", "--", sys.executable, str(CASES_DIR / case.script), *case.args)
    assert run.code == (1 if case.dense_layers else 0), run.stdout + run.stderr
    (process,) = [r for r in run.report["results"] if r["probe"] != "run"]
    rows = [row for row in process["measurements"]["call_sites"] if row["impl"] == "flex_attention"]
    names = [row["module"] or row["function"] for row in rows]
    assert sorted(names) == sorted(case.dense_layers | case.fused_layers)
    for row in rows:
        dense = bool(row["dense_forward"])
        assert dense == (row["module"] in case.dense_layers) and (row["verdict"] == "fused") != dense
        assert row.get("cause_kind") == (case.cause if dense else None)
    (note,) = [f for f in process["findings"] if f["code"] == "hf-internal-flex-path"]
    assert sorted(note["evidence"]["modules"]) == sorted(LLAMA_LAYERS)


def test_check_compile_blames_static_shapes_not_python_numbers_on_the_packed_wrapper(cli_here):
    """check-compile on the torchtune 0.6.1-style wrapper (compiled with dynamic=False) at varying
    lengths: the fix is the static shapes, not "capture Python numbers as tensors"."""
    target = f"{CASES_DIR / 'packed_static.py'}:compile_friendly_flex_attention"
    run = cli_here("check-compile", target, "--device", "cpu", "--vary", "5")
    assert run.code == 1, run.stdout + run.stderr
    (limit,) = run.findings("recompile-limit-fallback")
    assert "size mismatch" in limit["evidence"]["guard"]
    assert "dynamic=False" in limit["fix"] and "Python number" not in limit["fix"]
    assert run.check("call")["summary"].startswith("called as target(q, k, v, block_mask=...)")


HELD_OUT_DRAFTER = ROOT / "benchmarks" / "held_out_drafter.py"
TINY_DRAFTER = (
    *("--device", "cpu", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"),
    *("--intermediate", "128", "--vocab", "256", "--context", "128", "--blocks", "4", "--steps", "3", "--warmup", "1"),
)
DRAFTER_LAYERS = [f"layers.{i}.self_attn" for i in range(4)]


@pytest.mark.parametrize("command", ["trace-attention", "run"])
@pytest.mark.parametrize("backend", [None, "aot_eager"], ids=["healthy", "aot_eager"])
def test_a_drafter_calling_transformers_compiled_flex_itself_is_one_flex_row_per_layer(command, backend, cli_here):
    """The SpecForge-style drafter's attention calls transformers' `compile_friendly_flex_attention`
    itself, not through the attention interface: each layer is one flex row at the drafter's line,
    fused through transformers' singleton; compiled whole with aot_eager, every layer dense with the
    model's backend as the cause (transformers hands the raw function to the model's graph)."""
    args = (*TINY_DRAFTER, *(("--compile-model", backend) if backend else ()))
    truth = subprocess.run(
        [sys.executable, str(CASES_DIR / "ground_truth.py"), str(HELD_OUT_DRAFTER), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert truth.returncode == 0, truth.stderr[-2000:]
    dense_forwards = json.loads(truth.stdout.strip().splitlines()[-1])["dense_forwards"]
    if command == "run":
        run = cli_here("run", "--", sys.executable, str(HELD_OUT_DRAFTER), *args)
        (result,) = [r for r in run.report["results"] if r["probe"] != "run"]
    else:
        run = cli_here("trace-attention", "--script", str(HELD_OUT_DRAFTER), "--", *args)
        (result,) = run.report["results"]
    assert run.code == (1 if backend else 0), run.stdout + run.stderr
    rows = [r for r in result["measurements"]["call_sites"] if r["impl"] == "flex_attention"]
    assert sorted(r["module"] for r in rows) == DRAFTER_LAYERS, rows
    # eagerly, the line that called transformers; inside the model's graph, the line calling the layer
    site = "out = compile_friendly_flex_attention(" if not backend else "draft = draft + self.self_attn("
    for row in rows:
        assert (row["file"], row["line"]) == (str(HELD_OUT_DRAFTER), _drafter_line(site))
        assert row["origin"].startswith("user code")
    if not backend:
        assert dense_forwards == 0
        assert {(r["path"], r["verdict"]) for r in rows} == {("transformers-compiled", "fused")}
        assert all("compile_friendly_flex_attention" in r["via"] for r in rows)
        return
    assert sum(r["dense_forward"] for r in rows) == dense_forwards == 12  # 3 steps, 4 layers
    assert {(r["verdict"], r["cause_kind"]) for r in rows} == {("dense despite compile", "model-backend")}
    compile_line = _drafter_line("drafter = torch.compile(drafter, backend=args.compile_model)")
    findings = [f for f in result["findings"] if f["code"] == "dense-forward"]
    assert len(findings) == 4
    for found in findings:
        assert f"held_out_drafter.py:{compile_line}" in found["detail"]
        assert "backend='aot_eager'" in found["fix"] and "does not help" in found["fix"]


def _drafter_line(text: str) -> int:
    lines = HELD_OUT_DRAFTER.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(text))
