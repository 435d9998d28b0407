"""What `dflashdoctor run` costs a held-out drafter, with its agent loaded the two ways.

`run` starts its agent before the program's first import (the bootstrap's sitecustomize); the
in-process benchmarks start it after torch and transformers are loaded. Each repeat runs
`held_out_drafter.py` as whole processes, one per mode (`--modes`), in an order rotated every repeat:
"plain"; "run", under `dflashdoctor run`; "bootstrap", in the environment `run` gives its command
but with no doctor watching (the agent before the first import, in every Python child too);
"after-imports", the agent started by the program after its imports; "after-model", after the
drafter is built too, as the in-process benchmarks start it. Where "run" and "bootstrap" agree, the
cost is the agent's, not the doctor's; where "bootstrap" and "after-imports" part, it is what the
agent does to modules it sees imported; where "after-imports" and "after-model" part, what it does
to the model it sees built. Each
process prints the median of its own step times after warm-up (timed inside the program) and,
with `--profile-steps`, its step time under torch.profiler and the profiler's events per step.

    python3 benchmarks/run_cost_two_ways.py --repeats 3 -- --device cuda
    python3 benchmarks/run_cost_two_ways.py --repeats 2 -- --device cpu --hidden 64 --heads 4 \
        --kv-heads 2 --head-dim 16 --intermediate 128 --vocab 256 --context 128 --blocks 4

Prints every process's figures, then per mode the median over repeats and its ratio to plain.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from run_cost_settled import mode_command

_PROGRAM = str(Path(__file__).with_name("held_out_drafter.py"))
_MODES = ("plain", "run", "bootstrap", "after-imports", "after-model")
_FIGURES = {
    "step_ms": re.compile(r"^median step ms: ([\d.]+)$", re.MULTILINE),
    "profiled_ms": re.compile(r"^profiled step ms: ([\d.]+);", re.MULTILINE),
    "events": re.compile(r"profiler events per step: ([\d.]+)$", re.MULTILINE),
}


def _command(mode: str, program_args: list[str], scratch: Path) -> tuple[list[str], dict[str, str] | None]:
    """The process line and environment of one mode; "bootstrap" is run_cost_settled.py's "agent"."""
    program = [sys.executable, _PROGRAM, *program_args]
    if mode.startswith("after-"):
        return [*program, "--agent-at", mode.removeprefix("after-")], None
    return mode_command({"bootstrap": "agent"}.get(mode, mode), program, scratch)


def _figures(output: str) -> dict[str, float]:
    found = {name: pattern.findall(output) for name, pattern in _FIGURES.items()}
    if not found["step_ms"]:
        raise SystemExit(f"no median step time in the program's output:\n{output[-3000:]}")
    return {name: float(values[-1]) for name, values in found.items() if values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    parser.add_argument("--modes", default=",".join(_MODES), help=f"comma-separated, from {', '.join(_MODES)}")
    args, program_args = parser.parse_known_args()
    program_args = [a for a in program_args if a != "--"]
    modes = tuple(m for m in args.modes.split(",") if m)
    if "plain" not in modes or not set(modes) <= set(_MODES):
        raise SystemExit(f"--modes: plain and any of {', '.join(_MODES)}")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-two-ways-") as tmp:
        for repeat in range(args.repeats):
            order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
            for mode in order:
                scratch = Path(tmp, f"{repeat}-{mode}")
                scratch.mkdir()
                command, env = _command(mode, program_args, scratch)
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
                figures = _figures(done.stdout)
                results[mode].append(figures)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in figures.items())
                print(f"repeat {repeat} {mode:13s}: {shown} (exit {done.returncode})", flush=True)
    plain = {name: statistics.median(r[name] for r in results["plain"] if name in r) for name in results["plain"][0]}
    print(f"medians over {args.repeats} repeats, ratio to plain:")
    for mode in modes:
        cells = []
        for name, base in plain.items():
            values = [r[name] for r in results[mode] if name in r]
            if values:
                median = statistics.median(values)
                cells.append(f"{name} {median:.3f} ({median / base:.3f})")
        print(f"  {mode:13s}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
