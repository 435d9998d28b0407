"""The real-code cases as one table: for each, the ground truth taken without dflashdoctor
(tests/realworld/ground_truth.py: dense forwards from torch.profiler, recompile-limit hits from
dynamo's records), trace-attention's verdict, dense layers and cause, `run`'s verdict, and the wall
time of the plain script, of trace-attention and of run (one sample each: compile time dominates).

    python3 scripts/realworld_table.py [--device cuda]
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


def _cases(device: str) -> list[list[str]]:
    train = GPU_TRAIN if device == "cuda" else []
    titan = ["--device", "cuda"] if device == "cuda" else []
    return [
        ["hf_llama_compiled.py", "--backend", "aot_eager", *train],
        ["hf_llama_compiled.py", *train],
        ["hf_llama_compiled.py", "--static", "--grow", *train],
        *([] if device == "cuda" else [["hf_llama_compiled.py", "--grow"]]),  # its GPU compile alone takes minutes
        ["titan_rebound.py", "--rebind", *titan],
        ["titan_rebound.py", *titan],
        *([] if device == "cuda" else [["packed_static.py"], ["prefix_lm_global.py"]]),  # CPU-only cases
    ]


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
    args = parser.parse_args()
    print(
        "| case | truth: dense fwd, limit hits | trace verdict | dense layers (fwd/bwd) | cause | run verdict "
        "| plain s | trace s | run s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for case in _cases(args.device):
            plain, done = _timed([sys.executable, *case])
            if done.returncode != 0:
                print(f"| {' '.join(case)} | the plain script failed: {done.stderr.strip()[-200:]} |")
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
                f"| {' '.join(case)} | {truth['dense_forwards']}, {truth['recompile_limit_hits']} "
                f"| {trace['verdict']} | {layers or '-'} | {causes} | {run['verdict']} "
                f"| {plain:.1f} | {trace_wall:.1f} | {run_wall:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
