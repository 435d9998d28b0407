"""The real-code cases as one table: for each, the ground truth taken without dflashdoctor
(tests/realworld/ground_truth.py: dense forwards from torch.profiler, recompile-limit hits from
dynamo's records), trace-attention's verdict, dense layers and cause, `run`'s verdict, and the wall
time of the plain script, of trace-attention and of run (one sample each: compile time dominates).

    python3 scripts/realworld_table.py [--device cuda] [--only static,drafter] [--skip titan]

The last two cases are the held-out DFlash drafter (benchmarks/held_out_drafter.py, after SpecForge's),
whose layers call transformers' compiled flex themselves: healthy, and compiled whole with aot_eager.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "realworld"
GPU_TRAIN = ["--device", "cuda", "--train", "--seq", "4096", "--layers", "4"]
DRAFTER = str(ROOT / "benchmarks" / "held_out_drafter.py")
# On the GPU: hidden 2048, 4 layers, bf16, forward and backward; context 2048 keeps one case near a minute.
GPU_DRAFTER = ["--device", "cuda", "--context", "2048", "--blocks", "32", "--steps", "4", "--warmup", "1"]
CPU_DRAFTER = [
    *("--device", "cpu", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"),
    *("--intermediate", "128", "--vocab", "256", "--context", "128", "--blocks", "4", "--steps", "3", "--warmup", "1"),
]


def _cases(device: str) -> list[list[str]]:
    train = GPU_TRAIN if device == "cuda" else []
    titan = ["--device", "cuda"] if device == "cuda" else []
    # On an H200 five lengths hit the recompile limit of the model's frame only; ten reach flex's own.
    lengths = ["--lengths", "10"] if device == "cuda" else []
    drafter = [DRAFTER, *(GPU_DRAFTER if device == "cuda" else CPU_DRAFTER)]
    return [
        ["hf_llama_compiled.py", "--backend", "aot_eager", *train],
        ["hf_llama_compiled.py", *train],
        ["hf_llama_compiled.py", "--static", "--grow", *lengths, *train],
        *([] if device == "cuda" else [["hf_llama_compiled.py", "--grow"]]),  # its GPU compile alone takes minutes
        ["titan_rebound.py", "--rebind", *titan],
        ["titan_rebound.py", *titan],
        *([] if device == "cuda" else [["packed_static.py"], ["prefix_lm_global.py"]]),  # CPU-only cases
        [*drafter, "--compile-model", "aot_eager"],
        drafter,
    ]


def _label(case: list[str]) -> str:
    return " ".join([Path(case[0]).name, *case[1:]])


def _timed(command: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=CASES)
    return time.perf_counter() - start, done


def _doctor(command: str, case: list[str], work: Path) -> tuple[float, dict]:
    folder = work / f"{command}-{len(list(work.iterdir()))}"
    if command == "run":
        argv = ["run", "--report-dir", str(folder), "--", sys.executable, *case]
    else:
        argv = ["trace-attention", "--report-dir", str(folder), "--script", case[0], "--", *case[1:]]
    wall, _ = _timed([sys.executable, "-m", "dflashdoctor", *argv])
    return wall, json.loads((folder / "report.json").read_text())


def _flex_rows(report: dict) -> list[dict]:
    rows = [row for result in report["results"] for row in result["measurements"].get("call_sites", [])]
    return [row for row in rows if row.get("impl") == "flex_attention"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--only", default="", help="comma-separated words: the cases whose command has one")
    parser.add_argument("--skip", default="", help="comma-separated words: leave out the cases whose command has one")
    args = parser.parse_args()
    words = [w for w in args.only.split(",") if w]
    skipped = [w for w in args.skip.split(",") if w]
    cases = [
        c
        for c in _cases(args.device)
        if (not words or any(w in _label(c) for w in words)) and not any(w in _label(c) for w in skipped)
    ]
    print(
        "| case | truth: dense fwd, limit hits | trace verdict | dense layers (fwd/bwd) | cause | run verdict "
        "| plain s | trace s | run s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for case in cases:
            plain, done = _timed([sys.executable, *case])
            if done.returncode != 0:
                print(f"| {_label(case)} | the plain script failed: {done.stderr.strip()[-200:]} |")
                continue
            truth = json.loads(
                subprocess.run(
                    [sys.executable, "ground_truth.py", *case], capture_output=True, text=True, cwd=CASES
                ).stdout.splitlines()[-1]
            )
            trace_wall, trace = _doctor("trace-attention", case, work)
            run_wall, run = _doctor("run", case, work)
            dense = [r for r in _flex_rows(trace) if r["dense_forward"] or r["dense_backward"]]
            layers = ", ".join(
                f"{r['module'] or r['function']} ({r['dense_forward']}/{r['dense_backward']})" for r in dense
            )
            causes = ", ".join(sorted({str(r.get("cause_kind")) for r in dense})) or "-"
            print(
                f"| {_label(case)} | {truth['dense_forwards']}, {truth['recompile_limit_hits']} "
                f"| {trace['verdict']} | {layers or '-'} | {causes} | {run['verdict']} "
                f"| {plain:.1f} | {trace_wall:.1f} | {run_wall:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
