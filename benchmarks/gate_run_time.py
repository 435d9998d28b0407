"""What `run` in the gate costs, and whether it should run after the probes or beside them.

Four modes, warm caches (one untimed gate with `run` first fills them), whole processes, in an
order rotated every repeat; medians over repeats:
- `gate`: the gate on the embedded default, no `run`;
- `run`: `dflashdoctor run --steps N -- TRAINER` alone (the floor of the run section);
- `gate+run`: the gate with `run = TRAINER`, as it ships (the run after the probes);
- `beside`: the gate without `run` and the `run` alone started together, timed until both end
  (what running the two beside each other would cost, with nothing shared but the machine).

    python3 benchmarks/gate_run_time.py --repeats 3 [--device cpu] [-- TRAINER ARGS]

TRAINER defaults to the reference trainer, `python -m dflashdoctor.reference.trainer` (pairs on
threads, each a target and a DFlash drafter), with `--steps 3` from run_steps.
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

DOCTOR = [sys.executable, "-m", "dflashdoctor"]


def _start(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wall(groups: list[list[str]], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    children = [_start(argv, cwd, env) for argv in groups]
    codes = [child.wait() for child in children]
    if any(code not in (0, 1) for code in codes):
        print(f"  exit codes {codes} for {groups}", flush=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("trainer", nargs="*", default=[sys.executable, "-m", "dflashdoctor.reference.trainer"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"), TRITON_CACHE_DIR=str(work / "triton"))
        (work / "plain").mkdir()
        (work / "plain" / "dflashdoctor.toml").write_text(f'device = "{args.device}"\n')
        (work / "with").mkdir()
        (work / "with" / "dflashdoctor.toml").write_text(  # a JSON list of strings is a TOML array
            f'device = "{args.device}"\nrun = {json.dumps(args.trainer)}\nrun_steps = {args.steps}\n'
        )
        gate = [*DOCTOR, "gate", "--report-dir", "reports"]
        runs = iter(range(1_000_000))

        def run_alone() -> list[str]:
            folder = work / f"run-{next(runs)}"
            return [*DOCTOR, "run", "--report-dir", str(folder), "--steps", str(args.steps), "--", *args.trainer]

        modes = {
            "gate": lambda: _wall([gate], work / "plain", env),
            "run": lambda: _wall([run_alone()], work, env),
            "gate+run": lambda: _wall([gate], work / "with", env),
            "beside": lambda: _wall([gate, run_alone()], work / "plain", env),
        }
        print(f"warming the caches: {modes['gate+run']():.1f} s", flush=True)
        times: dict[str, list[float]] = {name: [] for name in modes}
        names = list(modes)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                times[name].append(modes[name]())
                print(f"repeat {repeat} {name:9}: {times[name][-1]:.1f} s", flush=True)
        base = statistics.median(times["gate"])
        print(f"medians over {args.repeats} repeats, ratio to the gate alone:")
        for name in names:
            median = statistics.median(times[name])
            print(f"  {name:9}: {median:.1f} s ({median / base:.2f})")


if __name__ == "__main__":
    main()
