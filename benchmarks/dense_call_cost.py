"""What recording a dense flex_attention call costs a program that keeps running while diagnosed.

    python3 benchmarks/dense_call_cost.py --repeats 20 --processes 12 [--baseline DIR]
    python3 benchmarks/dense_call_cost.py --processes 0        # in-process only
    python3 benchmarks/dense_call_cost.py --repeats 0          # whole-process only

The workload (`dense_layers.py`): 15 layers, each calling flex_attention raw, so on the CPU each
call runs the dense kernel that the recorders exist to catch; an in-process sample is `--forwards`
forwards (15 dense calls each), a whole process 10 timed forwards (150 dense calls) after one
untimed. One torch thread: on a shared 2-core machine more spread the samples several times over.

In-process, each mode against plain samples in the same process, in the order plain, mode, mode,
plain per repeat (`abba`):
- dense: the dense-kernel hook as trace-attention and `run` construct it (`DenseFlexRecorder` with
  a module namer; trace-attention's memory measuring, which acts on CUDA only), the layers calling
  the raw function;
- run: the agent `run` loads into every process (`ProcessAgent.start`: event log on disk, every
  torch instrument), the layers calling the recording stand-in the agent puts at
  `torch.nn.attention.flex_attention.flex_attention`, as a program does that imports it under `run`.
  Plain samples set the agent's recorders aside (`run_agent_overhead.suspended`). The agent logs the
  first 200 dense kernels of a process, so `--settle` forwards before timing measure the steady
  state past them.
Printed per mode: the medians per forward ("ms/step"), their ratio with a 95% bootstrap interval,
the cost per dense call from their difference, and the recorder's own work per dense call timed
inside it (the hook's `_record`; the agent's handling of the event, its log line included).

Whole-process (`--processes` rounds, the order rotated each round): `python3 dense_layers.py`;
`dflashdoctor trace-attention --script dense_layers.py`; `dflashdoctor run -- python3
dense_layers.py`; with `--baseline DIR`, the two commands again with the dflashdoctor in DIR
(`git archive REV dflashdoctor probes | tar -x -C DIR`, then `ln -s ../probes DIR/dflashdoctor/probes`
so that its probes are its own where an editable install would find this checkout's). Per command:
the median time of the 10 timed forwards as the script measured it (so without the doctor's
start-up and report), its ratio to plain with a 95% interval and the cost per dense call, and the
median wall time of the whole command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.attention.flex_attention as flex_module
from dense_layers import build, options
from drafter_bench import abba, print_ratio, ratio_interval
from run_agent_overhead import suspended

from dflashdoctor.agent.config import RunSettings
from dflashdoctor.agent.process import ProcessAgent
from dflashdoctor.agent.torch_instruments import TorchInstruments
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.module_names import ModuleNamer
from dflashdoctor.observations import DenseEvent

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_WORKLOAD = os.path.join(_HERE, "dense_layers.py")


class _TimedRecorder(DenseFlexRecorder):
    """The dense hook, timing its own work per call (`_record` one frame further from the kernel's
    caller, which its walk passes over as dflashdoctor's own)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds: list[float] = []

    def _record(self, kind: str, args: tuple[Any, ...]) -> DenseEvent:
        started = time.perf_counter()
        event = super()._record(kind, args)
        self.seconds.append(time.perf_counter() - started)
        return event


def _timed(fn: Callable[[DenseEvent], None], seconds: list[float]) -> Callable[[DenseEvent], None]:
    def timed(event: DenseEvent) -> None:
        started = time.perf_counter()
        fn(event)
        seconds.append(time.perf_counter() - started)

    return timed


def _us(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e6:.1f} us (mean {statistics.mean(seconds) * 1e6:.1f})"


def _lines(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


def _use(model: torch.nn.Module, attention: Callable[..., torch.Tensor]) -> None:
    for layer in model.layers:
        layer.attention = attention


def _seconds_per_forward(model: torch.nn.Module, x: torch.Tensor, forwards: int) -> float:
    started = time.perf_counter()
    for _ in range(forwards):
        model(x)
    return (time.perf_counter() - started) / forwards


def _print_mode(times: dict[str, list[float]], mode: str, layers: int) -> None:
    print_ratio(times, mode, mode)  # "ms/step": one step here is one forward of `layers` dense calls
    added = (statistics.median(times[mode]) - statistics.median(times["plain"])) / layers
    print(f"  added per dense call: {added * 1e6:.0f} us (medians' difference over {layers} calls a forward)")


@contextlib.contextmanager
def _agent(folder: str) -> Iterator[TorchInstruments]:
    agent = ProcessAgent(folder, RunSettings())
    agent.start()
    instruments = agent.torch
    if not isinstance(instruments, TorchInstruments) or instruments.flex is None:
        raise SystemExit(f"the agent did not instrument torch here: {instruments and instruments.unavailable}")
    try:
        yield instruments
    finally:  # the last entered first
        for recorder in (instruments.hf, instruments.flex, instruments.dense):
            if recorder is not None:
                recorder.__exit__(None, None, None)


def in_process(args: argparse.Namespace) -> None:
    model, x = build(args)
    raw = flex_module.flex_attention
    with torch.no_grad():
        model(x)  # torch compiles flex_attention's eager wrapper on the first call
        dense = _TimedRecorder(measure_memory=True, namer=ModuleNamer())

        def timed_dense(mode: str) -> float:
            with dense if mode == "dense" else contextlib.nullcontext():
                return _seconds_per_forward(model, x, args.forwards)

        times = abba(timed_dense, "dense", args.repeats)
        if not dense.events or dense.events[-1].layer != f"layers.{args.layers - 1}":
            raise SystemExit("the dense hook did not record the benchmark's calls with their layers")
        print(f"dense hook: {args.repeats} repeats x 2 samples x {args.forwards} forwards per mode")
        _print_mode(times, "dense", args.layers)
        print(f"  the hook's own work (_record) per dense call: {_us(dense.seconds)}")

        with tempfile.TemporaryDirectory(prefix="dflashdoctor-dense-bench-") as folder, _agent(folder) as agent:
            stand_in = flex_module.flex_attention
            logging: list[float] = []
            agent.dense.on_event = _timed(agent._dense_event, logging)
            for _ in range(args.settle):
                _use(model, stand_in)
                model(x)

            def timed_run(mode: str) -> float:
                _use(model, stand_in if mode == "run" else raw)
                with suspended(agent) if mode == "plain" else contextlib.nullcontext():
                    return _seconds_per_forward(model, x, args.forwards)

            times = abba(timed_run, "run", args.repeats)
            expected = (args.settle + 2 * args.repeats * args.forwards) * args.layers
            if agent.dense_seen != expected:
                raise SystemExit(f"the agent saw {agent.dense_seen} dense kernels, not the {expected} it ran")
            logged = sum(_lines(os.path.join(folder, name)) for name in os.listdir(folder))
        print(
            f"run's agent: {args.repeats} repeats x 2 samples x {args.forwards} forwards per mode, "
            f"after {args.settle} untimed; {agent.dense_seen} dense kernels, {logged} event lines written"
        )
        _print_mode(times, "run", args.layers)
        print(f"  the agent's dense event (count, log line) per dense call: {_us(logging)}")


def _command(kind: str, times_to: str, report: str, workload_args: list[str]) -> list[str]:
    script_args = ["--times-to", times_to, *workload_args]
    if kind == "plain":
        return [sys.executable, _WORKLOAD, *script_args]
    doctor = [sys.executable, "-m", "dflashdoctor", kind, "--report-dir", report]
    if kind == "trace-attention":
        return [*doctor, "--device", "cpu", "--script", _WORKLOAD, "--", *script_args]
    return [*doctor, "--hang-timeout", "0", "--", sys.executable, _WORKLOAD, *script_args]


def whole_process(args: argparse.Namespace) -> None:
    versions = {"": _ROOT} | ({" (baseline)": str(args.baseline.resolve())} if args.baseline else {})
    # (label, kind, the folder holding the dflashdoctor it runs); plain imports none
    jobs = [("plain", "plain", _ROOT)] + [
        (kind + suffix, kind, root) for suffix, root in versions.items() for kind in ("trace-attention", "run")
    ]
    inside: dict[str, list[float]] = {label: [] for label, _, _ in jobs}
    wall: dict[str, list[float]] = {label: [] for label, _, _ in jobs}
    workload_args = [f"--{name}={getattr(args, name)}" for name in ("layers", "seq", "dim", "heads", "threads")]
    workload_args.append(f"--forwards={args.process_forwards}")
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-dense-bench-") as tmp:
        for round_ in range(args.processes):
            for offset in range(len(jobs)):
                label, kind, root = jobs[(round_ + offset) % len(jobs)]
                name = f"{label.replace(' ', '')}-{round_}"
                times_to = os.path.join(tmp, f"{name}.json")
                command = _command(kind, times_to, os.path.join(tmp, f"report-{name}"), workload_args)
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
                started = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=root, env=env)
                wall[label].append(time.perf_counter() - started)
                try:
                    with open(times_to, encoding="utf-8") as handle:
                        inside[label].append(json.loads(handle.read())["forwards_s"])
                except OSError:
                    output = done.stderr[-3000:]
                    raise SystemExit(f"{label} wrote no timing (exit {done.returncode}):\n{output}") from None
                print(f"round {round_} {label:28s} script {inside[label][-1]:7.3f} s  wall {wall[label][-1]:7.3f} s")
    calls = args.layers * args.process_forwards
    plain_script, plain_wall = statistics.median(inside["plain"]), statistics.median(wall["plain"])
    print(f"whole process: {args.processes} rounds; {calls} timed dense calls a process, medians (s)")
    print(f"{'':>28} {'script':>8} {'ratio':>6} {'95% interval':>16} {'us/call':>8} {'wall':>8} {'ratio':>6}")
    for label in inside:
        script_s, wall_s = statistics.median(inside[label]), statistics.median(wall[label])
        low, high = ratio_interval(inside["plain"], inside[label])
        per_call = (script_s - plain_script) / calls * 1e6
        print(
            f"{label:>28} {script_s:8.3f} {script_s / plain_script:6.3f}   [{low:.3f}, {high:.3f}] {per_call:8.0f}"
            f" {wall_s:8.3f} {wall_s / plain_wall:6.3f}"
        )
    for label in inside:
        print(f"  {label}: script " + ", ".join(f"{t:.3f}" for t in inside[label]))
        print(f"  {label}: wall " + ", ".join(f"{t:.3f}" for t in wall[label]))


def main() -> None:
    parser = options(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.set_defaults(forwards=2)
    parser.add_argument("--repeats", type=int, default=10, help="in-process ABBA repeats per mode (0: none)")
    parser.add_argument("--settle", type=int, default=0, help="untimed forwards under the agent first")
    parser.add_argument("--processes", type=int, default=5, help="whole-process rounds (0: none)")
    parser.add_argument("--process-forwards", type=int, default=10, help="timed forwards a whole process")
    parser.add_argument("--baseline", type=Path, help="another version's folder, its whole processes alternated")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # flex_attention warns that it is not compiled: that is the point here
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} torch threads")
    print(f"model: {args.layers} layers, raw flex_attention, q/k/v 1x{args.heads}x{args.seq}x{args.dim // args.heads}")
    if args.repeats:
        in_process(args)
    if args.processes:
        whole_process(args)


if __name__ == "__main__":
    main()
