"""What `dflashdoctor run` costs a training step: the reference trainer, plain and under `run`.

Each repeat runs the trainer twice, once plain and once as `dflashdoctor run -- python -m
dflashdoctor.reference.trainer`, alternating which goes first; the steady-state step time of a run
is the median of its steps after `--warmup` (compilation and tuning happen in the first steps).
Prints both medians over repeats and their ratio (run / plain).

    python3 benchmarks/run_overhead.py [--steps 20] [--warmup 5] [--repeats 3] [-- trainer args]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_STEP = re.compile(r"^step (\d+): loss \S+, ([\d.]+) ms$", re.MULTILINE)


def _steady_ms(output: str, warmup: int) -> float:
    times = [float(ms) for step, ms in _STEP.findall(output) if int(step) >= warmup]
    if not times:
        raise SystemExit(f"no step times after warm-up in the trainer's output:\n{output[-2000:]}")
    return statistics.median(times)


def _trainer(steps: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "dflashdoctor.reference.trainer", "--steps", str(steps), *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    plain, instrumented = [], []
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-run-bench-") as tmp:
        for repeat in range(args.repeats):
            order = ("plain", "run") if repeat % 2 == 0 else ("run", "plain")
            for kind in order:
                command = _trainer(args.steps, extra)
                if kind == "run":
                    report = Path(tmp, f"report-{repeat}")
                    command = [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(report), "--", *command]
                done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
                ms = _steady_ms(done.stdout, args.warmup)
                (plain if kind == "plain" else instrumented).append(ms)
                print(f"repeat {repeat} {kind:5s}: steady step {ms:.2f} ms (exit {done.returncode})", flush=True)
    p, r = statistics.median(plain), statistics.median(instrumented)
    print(f"plain {p:.2f} ms, under run {r:.2f} ms (medians over {args.repeats} repeats); ratio {r / p:.3f}")


if __name__ == "__main__":
    main()
