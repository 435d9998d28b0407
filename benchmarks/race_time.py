"""Wall time of `dflashdoctor race` on real kernels, per trial, against another version in the same run.

    python3 benchmarks/race_time.py [--kernel fla] [--trials 3] [--repeats 2] [--baseline DIR] [--keep DIR]

Each repeat runs `race --kernel K --threads 2 --trials N --fix F --json` with this version and, when
`--baseline DIR` names a folder holding another version's dflashdoctor/ and probes/ (`git archive
REV dflashdoctor probes | tar -x -C DIR`), with that one, alternating. Both share one folder of
compiled Triton binaries, filled by a warm-up run first, so what is timed is what every trial pays:
starting, importing the workload and tuning cold (the race's window), not compiling. Printed: the
race's wall time, the time per trial (wall / trials), the mean of each version's trials after its
first where the report has them, the failure count, and the ratio to the baseline by medians.
Without a GPU the default kernel is the stub's shared autotuner under triton's interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STUB = "dflashdoctor.autotune.stub_kernel:shared_add"


def _race(
    package: Path, args: argparse.Namespace, binaries: Path, trials: int, report: Path | None = None
) -> tuple[float, dict[str, Any]]:
    argv = [sys.executable, "-m", "dflashdoctor", "race", "--kernel", args.kernel, "--threads", "2"]
    argv += ["--trials", str(trials), "--fix", args.fix, "--triton-binaries", str(binaries), "--json"]
    argv += ["--timeout", str(args.timeout)] + (["--report-dir", str(report)] if report else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(package), os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=package)
    elapsed = time.perf_counter() - started
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        print(f"{package}: race exited {proc.returncode} without a report:\n{proc.stderr[-2000:]}")
        return elapsed, {}
    return elapsed, report["results"][0]["measurements"]


def _describe(name: str, walls: list[float], trials: list[list[dict[str, Any]]], count: int) -> float:
    per_trial = statistics.median(walls) / count
    later = [t["wall_s"] for series in trials for t in series[1:] if "wall_s" in t]
    failed = sum(1 for series in trials for t in series if t.get("failed"))
    hosts = sum(1 for series in trials for t in series if t.get("fresh_process", True))
    print(
        f"{name}: race {statistics.median(walls):.1f} s median ({', '.join(f'{w:.1f}' for w in walls)}), "
        f"{per_trial:.1f} s a trial; trials failed {failed} of {sum(len(s) for s in trials)}; processes {hosts}"
        + (f"; trials after the first {statistics.mean(later):.1f} s each (in-host)" if later else "")
    )
    return per_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default=None, help="fla, reference or a TARGET (default: fla on a GPU)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--fix", default="none")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=580)
    parser.add_argument("--baseline", type=Path, help="another version's folder, timed alternately")
    parser.add_argument("--keep", type=Path, help="write this version's reports here, one folder per repeat")
    args = parser.parse_args()
    if args.kernel is None:
        import torch

        args.kernel = "fla" if torch.cuda.is_available() else STUB
    args.keep = args.keep.resolve() if args.keep else None
    versions = {"this": ROOT}
    if args.baseline is not None:
        versions["baseline"] = args.baseline.resolve()
    print(f"race --kernel {args.kernel} --threads 2 --trials {args.trials} --fix {args.fix}, {args.repeats} repeats")
    with tempfile.TemporaryDirectory(prefix="race-time-") as tmp:
        binaries = Path(tmp) / "triton"
        binaries.mkdir()
        warm, _ = _race(ROOT, args, binaries, 1)
        print(f"warm-up (compiles the kernels into the shared binaries folder): {warm:.1f} s")
        walls: dict[str, list[float]] = {name: [] for name in versions}
        trials: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in versions}
        for repeat in range(args.repeats):
            for name, package in versions.items():
                report = args.keep / f"{name}-{repeat}" if args.keep and name == "this" else None
                elapsed, measurements = _race(package, args, binaries, args.trials, report)
                walls[name].append(elapsed)
                trials[name].append(measurements.get("kernel_trials") or [])
    per_trial = {name: _describe(name, walls[name], trials[name], args.trials) for name in versions}
    if "baseline" in per_trial:
        print(f"per trial, this / baseline: {per_trial['this'] / per_trial['baseline']:.3f}")


if __name__ == "__main__":
    main()
