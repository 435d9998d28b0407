"""What `dflashdoctor run` costs the program it watches, with an interval narrow enough to settle it.

The program (default `held_out_drafter.py`, its options after `--`) runs as whole processes in four
modes: "plain"; "run", under `dflashdoctor run`; "quiet", the same launcher and agent with a doctor
that only waits for the command's end (what the watching itself costs is "run" against "quiet");
"agent", the environment `run` gives its command (the agent loaded before the first import, in
every Python child) with no doctor and no launcher. Each process prints its own step times (timed
inside the program, synchronised); a process's figure is the median of its steps after warm-up.

Two ways to pair them, since identical processes of such a program differ by more than the effect:
- `--pairing sequence`: each repeat runs every mode once, one after another, in an order rotated
  every repeat; a repeat's ratio is mode over plain of that repeat.
- `--pairing lockstep`: each repeat runs plain and one other mode at once, taking their steps in
  turn (a step of one, then a step of the other, through FIFOs): both see the same machine at the
  same moments. A repeat's ratio is the median over steps of step time over plain's same step. A
  plain-against-plain pair ("plain-2") says what the pairing itself leaves.
`--cpus` pins every process of every mode (and so the doctor, its launcher and the program's
children) to the same CPUs.

Printed per mode: the median of the repeats' ratios with a 95% bootstrap interval (10,000
resamples of the repeats), the spread of the log-ratios and how many repeats would narrow the
interval to +-1% at that spread, the median step, and the median whole-process wall time less
plain's of the same repeat (what a short run pays for the doctor's start and report).

    python3 benchmarks/run_cost_settled.py --repeats 20 -- --device cpu --hidden 64 --heads 4 --kv-heads 2 \\
        --head-dim 16 --intermediate 128 --vocab 256 --context 128 --blocks 4 --steps 60 --warmup 5
    python3 benchmarks/run_cost_settled.py --repeats 8 --pairing lockstep --cpus 0-7 -- --device cuda --inputs device

`--save FILE` keeps a run's own repeats and `--pool FILE` summarises them with a later run's: one
figure from repeats taken in several calls of a machine that limits how long a command may run. A
pool is read before anything is measured, and refused unless it was taken with the same program,
pairing, CPUs, modes, machine (GPU or CPU model) and dflashdoctor version.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import dflashdoctor
from dflashdoctor.agent.config import RunSettings
from dflashdoctor.runs import launch

_DRAFTER = str(Path(__file__).with_name("held_out_drafter.py"))
_MODES = ("plain", "run", "quiet", "agent")
_STEP = re.compile(r"^step (\d+): .*?, ([\d.]+) ms$", re.MULTILINE)
_MEDIAN = re.compile(r"^median step ms: ([\d.]+)$", re.MULTILINE)
_RESAMPLES = 10_000


@dataclass
class Process:
    mode: str
    steps: list[float]  # every step's ms, warm-up included
    median_ms: float
    wall_s: float


@dataclass
class Mode:
    ratios: list[float] = field(default_factory=list)  # per repeat, against that repeat's plain
    medians: list[float] = field(default_factory=list)
    extra_wall_s: list[float] = field(default_factory=list)


def _cpus(text: str | None) -> set[int] | None:
    """`0-7,12` as a set of CPU numbers."""
    if not text:
        return None
    chosen: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        chosen.update(range(int(first), int(last or first) + 1))
    return chosen


def mode_command(mode: str, program: list[str], scratch: Path) -> tuple[list[str], dict[str, str] | None]:
    if mode == "run":
        return [
            sys.executable,
            "-m",
            "dflashdoctor",
            "run",
            "--report-dir",
            str(scratch / "report"),
            "--",
            *program,
        ], None
    if mode == "quiet":
        return [sys.executable, __file__, "--quiet-doctor", str(scratch / "events"), "--", *program], None
    if mode == "agent":
        events = scratch / "events"
        events.mkdir()
        return program, launch.child_environment(launch.bootstrap_folder(scratch), events, RunSettings())
    return program, None


def quiet_doctor(events: Path, command: list[str]) -> int:
    """`run`'s launcher and agent, with a doctor that only waits for the command's end: no watch,
    no report."""
    events.mkdir(parents=True)
    bootstrap = launch.bootstrap_folder()
    env = launch.child_environment(bootstrap, events, RunSettings())
    with launch.start(launch.resolve_command(command), env, [bootstrap]) as child:
        return child.wait()


def _start(command: list[str], env: dict[str, str] | None, cpus: set[int] | None) -> subprocess.Popen[str]:
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin)


def _finish(mode: str, process: subprocess.Popen[str], started: float, timeout: float) -> Process:
    out, err = process.communicate(timeout=timeout)
    wall = time.perf_counter() - started
    medians = _MEDIAN.findall(out)
    if not medians or (process.returncode != 0 and mode != "run"):  # run's 1: it found something
        raise SystemExit(f"{mode}: exit {process.returncode}, no median step time:\n{out[-2000:]}\n{err[-3000:]}")
    steps = [float(ms) for _, ms in _STEP.findall(out)]
    return Process(mode, steps, float(medians[-1]), wall)


def _alone(mode: str, program: list[str], scratch: Path, cpus: set[int] | None, timeout: float) -> Process:
    command, env = mode_command(mode, program, scratch)
    started = time.perf_counter()
    return _finish(mode, _start(command, env, cpus), started, timeout)


def _in_turn(prefixes: list[Path], steps: int) -> None:
    """Let the processes take their steps in turn, one step each, in the order given."""
    gos = [open(f"{p}.go", "wb", buffering=0) for p in prefixes]  # noqa: SIM115 - closed below
    dones = [open(f"{p}.done", "rb", buffering=0) for p in prefixes]  # noqa: SIM115
    try:
        for _ in range(steps):
            for go, done in zip(gos, dones, strict=True):
                go.write(b".")
                if not done.read(1):
                    return
    except BrokenPipeError:
        return
    finally:
        for handle in (*gos, *dones):
            with contextlib.suppress(OSError):
                handle.close()


def _pair(
    modes: tuple[str, str], program: list[str], scratch: Path, cpus: set[int] | None, steps: int, timeout: float
) -> list[Process]:
    """Two processes at once, their steps taken in turn (the first mode's step first)."""
    prefixes, running = [], []
    started = time.perf_counter()
    for index, mode in enumerate(modes):
        prefix = scratch / f"turn{index}"
        for end in ("go", "done"):
            os.mkfifo(f"{prefix}.{end}")
        folder = scratch / f"{index}-{mode}"
        folder.mkdir()
        command, env = mode_command(mode, [*program, "--lockstep", str(prefix)], folder)
        running.append((mode, _start(command, env, cpus)))
        prefixes.append(prefix)
    conductor = threading.Thread(target=_in_turn, args=(prefixes, steps), daemon=True)
    conductor.start()
    done = [_finish(mode, process, started, timeout) for mode, process in running]
    conductor.join(timeout=10)
    return done


def _interval(values: list[float], rng: random.Random) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median."""
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(_RESAMPLES))
    return medians[int(0.025 * _RESAMPLES)], medians[int(0.975 * _RESAMPLES) - 1]


def _needed(ratios: list[float]) -> str:
    """Repeats for a 95% interval of +-1% on the mean log-ratio, at the spread seen."""
    if len(ratios) < 3:
        return "-"
    spread = statistics.stdev(math.log(r) for r in ratios)
    return str(math.ceil((1.96 * spread / 0.01) ** 2))


def _options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--modes", default="plain,run,quiet,agent", help=f"comma-separated, from {', '.join(_MODES)}")
    parser.add_argument("--pairing", choices=("sequence", "lockstep"), default="sequence")
    parser.add_argument("--cpus", help="pin every process to these CPUs, e.g. 0-7")
    parser.add_argument("--warmup", type=int, default=0, help="repeats run first and left out (caches, clocks)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    parser.add_argument("--budget", type=float, help="seconds: start no repeat that would end past this")
    parser.add_argument(
        "--control-every",
        type=int,
        default=1,
        help="lockstep: run the plain-2 pair every Nth repeat only (a process start is most of a pair's time, "
        "and the figure sought is run's)",
    )
    parser.add_argument("--program", default=_DRAFTER, help="a Python program printing `step N: ..., T ms` lines")
    parser.add_argument("--save", type=Path, help="write this run's repeats here (JSON), to pool them later")
    parser.add_argument(
        "--pool",
        type=Path,
        action="append",
        default=[],
        help="repeats saved by an earlier run of the same program and pairing, summarised with this run's "
        "(a device call's time limit splits one figure's repeats over several calls)",
    )
    parser.add_argument("--quiet-doctor", type=Path, help=argparse.SUPPRESS)
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def _program_option(program_args: list[str], name: str, default: int) -> int:
    """The program's `--steps` (lockstep gives that many turns) or `--warmup`, with held_out_drafter's
    defaults where the command line leaves it out."""
    for index, word in enumerate(program_args):
        if word == name and index + 1 < len(program_args):
            return int(program_args[index + 1])
        if word.startswith(f"{name}="):
            return int(word.split("=", 1)[1])
    return default


def _machine() -> str:
    """What the figures were taken on: the GPUs where nvidia-smi answers, else the CPU model. Repeats
    from an H100 and an H200 (a device call may get either) are not one figure."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout.split("\n")
        if any(gpus):
            return ", ".join(g.strip() for g in gpus if g.strip())
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def _finite_numbers(value: object) -> list[float] | None:
    if not isinstance(value, list) or not all(isinstance(v, int | float) and math.isfinite(v) for v in value):
        return None
    return [float(v) for v in value]


def _read_pool(path: Path, setting: dict[str, object]) -> dict[str, Mode]:
    """The repeats an earlier run saved with `--save`. One of another program, pairing, CPU set,
    modes, machine or dflashdoctor is refused (its repeats measure something else), as is a file
    that is not such a record; read before this run measures anything, so a bad file costs nothing."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--pool {path}: {exc}") from None
    if not isinstance(earlier, dict) or not isinstance(earlier.get("results"), dict):
        raise SystemExit(f"--pool {path}: not a file written by --save")
    if earlier.get("setting") != setting:
        raise SystemExit(f"--pool {path}: measured {earlier.get('setting')}, not {setting}")
    modes = {}
    for mode, kept in earlier["results"].items():
        lists = {name: _finite_numbers(kept.get(name)) if isinstance(kept, dict) else None for name in vars(Mode())}
        if any(values is None for values in lists.values()):
            raise SystemExit(f"--pool {path}: {mode}: every value must be a list of finite numbers")
        modes[mode] = Mode(**{name: values or [] for name, values in lists.items()})
    return modes


def _paired_this_repeat(others: list[str], repeat: int, control_every: int) -> list[str]:
    """The modes a lockstep repeat pairs with plain: every one, but plain-2 only every Nth repeat."""
    return [m for m in others if m != "plain-2" or repeat % max(1, control_every) == 0]


def _stepwise_ratio(other: Process, plain: Process, warmup: int) -> float:
    return statistics.median(o / p for o, p in zip(other.steps[warmup:], plain.steps[warmup:], strict=False))


def main(argv: list[str]) -> int:
    args, program_args = _options(argv)
    if args.quiet_doctor is not None:
        return quiet_doctor(args.quiet_doctor, program_args)
    modes = tuple(m for m in args.modes.split(",") if m)
    if "plain" not in modes or not set(modes) <= set(_MODES):
        raise SystemExit(f"--modes: plain and any of {', '.join(_MODES)}")
    cpus = _cpus(args.cpus)
    program = [sys.executable, args.program, *program_args]
    steps, warmup = _program_option(program_args, "--steps", 30), _program_option(program_args, "--warmup", 8)
    others = [m for m in modes if m != "plain"] + (["plain-2"] if args.pairing == "lockstep" else [])
    results = {mode: Mode() for mode in ("plain", *others)}
    # the program by name: a later device call may run the same tree from another folder
    setting = {
        "pairing": args.pairing,
        "cpus": args.cpus,
        "modes": list(modes),
        "program": [Path(args.program).name, *program_args],
        "machine": _machine(),
        "dflashdoctor": dflashdoctor.__version__,
    }
    pools = [_read_pool(path, setting) for path in args.pool]
    rng = random.Random(0)
    began = time.perf_counter()
    print(f"pairing {args.pairing}, cpus {args.cpus or 'all'}, program {' '.join(program[1:])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-settled-") as tmp:
        done = 0
        pair_s = 0.0  # the longest pair so far: what the budget expects the next repeat's pairs to take
        for repeat in range(-args.warmup, args.repeats):
            repeat_began = time.perf_counter()
            scratch = Path(tmp, str(repeat + args.warmup))
            scratch.mkdir()
            if args.pairing == "sequence":
                shift = repeat % len(modes)
                order = modes[shift:] + modes[:shift]
                ran = {}
                for mode in order:
                    folder = scratch / mode
                    folder.mkdir()
                    ran[mode] = _alone(mode, program, folder, cpus, args.timeout)
                plain = ran["plain"]
                line = [f"{m} {p.median_ms:.3f} ms {p.wall_s:.2f} s" for m, p in ran.items()]
                if repeat >= 0:
                    results["plain"].medians.append(plain.median_ms)
                    for mode in others:
                        results[mode].ratios.append(ran[mode].median_ms / plain.median_ms)
                        results[mode].medians.append(ran[mode].median_ms)
                        results[mode].extra_wall_s.append(ran[mode].wall_s - plain.wall_s)
            else:
                line = []
                for mode in _paired_this_repeat(others, repeat, args.control_every):
                    pair_began = time.perf_counter()
                    other = "plain" if mode == "plain-2" else mode
                    folder = scratch / mode
                    folder.mkdir()
                    # who steps first alternates, plain-2 too: stepping first or second is not the cost
                    first, second = (other, "plain") if repeat % 2 else ("plain", other)
                    a, b = _pair((first, second), program, folder, cpus, steps, args.timeout)
                    theirs, plain = (a, b) if repeat % 2 else (b, a)
                    ratio = _stepwise_ratio(theirs, plain, warmup)
                    line.append(f"{mode}/plain {ratio:.4f} ({theirs.median_ms:.3f} / {plain.median_ms:.3f} ms)")
                    if repeat >= 0:
                        results[mode].ratios.append(ratio)
                        results[mode].medians.append(theirs.median_ms)
                        results[mode].extra_wall_s.append(theirs.wall_s - plain.wall_s)
                        results["plain"].medians.append(plain.median_ms)
                    pair_s = max(pair_s, time.perf_counter() - pair_began)
            label = f"repeat {repeat}" if repeat >= 0 else f"warm-up {repeat + args.warmup}"
            print(f"{label}: " + "; ".join(line), flush=True)
            done = max(0, repeat + 1)  # a budget may stop it during warm-up
            took = time.perf_counter() - repeat_began
            if args.pairing == "lockstep":
                took = pair_s * len(_paired_this_repeat(others, repeat + 1, args.control_every))
            if args.budget is not None and time.perf_counter() - began + took > args.budget:
                break
    # the program by name: a later device call may run the same tree from another folder
    if args.save is not None:
        saved = {name: vars(found) for name, found in results.items()}
        try:
            args.save.write_text(json.dumps({"setting": setting, "repeats": done, "results": saved}, indent=1))
        except OSError as exc:  # the run's figures are still printed below
            print(f"--save {args.save}: not written: {exc}", file=sys.stderr)
    pooled = sum(len(earlier.get(others[0], Mode()).ratios) for earlier in pools)
    for earlier in pools:
        for name, found in results.items():
            kept = earlier.get(name, Mode())
            found.ratios += kept.ratios
            found.medians += kept.medians
            found.extra_wall_s += kept.extra_wall_s
    if min(len(results[mode].ratios) for mode in others if mode != "plain-2") < 2:
        raise SystemExit("fewer than two repeats ran: nothing to compare")
    took = f"{done} repeats in {time.perf_counter() - began:.0f} s"
    took += f", {pooled} pooled from earlier runs" if pooled else ""
    print(f"{took}; ratio to plain, median and 95% interval:")
    plain_medians = results["plain"].medians
    plain_ms = statistics.median(plain_medians)
    spread = statistics.stdev(plain_medians) / statistics.mean(plain_medians) if len(plain_medians) > 1 else 0.0
    print(f"  plain   : step {plain_ms:.3f} ms (processes spread {100 * spread:.1f}% sd/mean)")
    for mode in others:
        found = results[mode]
        if len(found.ratios) < 2:
            print(f"  {mode:8s}: {len(found.ratios)} repeat, too few for an interval")
            continue
        low, high = _interval(found.ratios, rng)
        print(
            f"  {mode:8s}: ratio {statistics.median(found.ratios):.4f} ({low:.4f} to {high:.4f}), "
            f"{len(found.ratios)} repeats, repeats for +-1%: {_needed(found.ratios)}, "
            f"step {statistics.median(found.medians):.3f} ms, "
            f"wall {statistics.median(found.extra_wall_s):+.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
