"""Cost of AutotunerGuard on a warm, single-thread call of a triton autotuned kernel.

    TRITON_INTERPRET=1 python benchmarks/autotuner_guard.py --repeats 7
    python benchmarks/autotuner_guard.py --device cuda   # needs fla-core

A warm call (its tuning key cached) is what a trainer makes at every step, so it is the one that
must not get slower. The kernel is the race's stub (a real `triton.autotune` Autotuner, two configs,
key tuned once before timing). Two workloads:
- `run only`: the Autotuner's launch replaced by a no-op, so the figure is `Autotuner.run`'s own
  Python path, the part the guard wraps: the worst case for a ratio;
- `interpreted launch`: the whole call including the kernel in triton's interpreter (on a GPU the
  launch is a compiled kernel instead; the interpreter only shows the guard is small beside a launch).
With `--device cuda`, real FLA work instead, each call synchronized:
- `fla gated delta rule`: `chunk_gated_delta_rule`'s forward at the race's shape (six autotuned
  kernels per call), the call that crashed in the original run;
- `reference target forward`: one data-parallel pair's target forward (reference/target_pairs.py:
  three gated DeltaNet layers through FLA, 2048 tokens), the unit a trainer's step repeats.
Each repeat times `--calls` calls per sample in the order plain, guarded, guarded, plain; medians
of the per-call time over all samples, and the ratio guarded/plain.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import triton

from dflashdoctor.autotune.stub_kernel import N_ELEMENTS, autotuned_add, launch
from dflashdoctor.hooks import AutotunerGuard


class _NoLaunch:
    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel

    def run(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


def _per_call(call: Callable[[], Any], calls: int, guarded: bool) -> float:
    with AutotunerGuard() if guarded else _Nothing():
        started = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - started) / calls


def _stub_workloads(calls: int) -> list[tuple[str, Callable[[], Any], int]]:
    workloads = []
    x, y, out = torch.randn(N_ELEMENTS), torch.randn(N_ELEMENTS), torch.empty(N_ELEMENTS)
    for workload, count in (("run only", calls), ("interpreted launch", max(1, calls // 20))):
        tuner = autotuned_add(lambda: None)
        launch(tuner, 0)  # tunes the key once: every timed call is warm
        if workload == "run only":
            tuner.fn = _NoLaunch(tuner.fn)
        grid = tuner[lambda meta: ((N_ELEMENTS + meta["BLOCK"] - 1) // meta["BLOCK"],)]
        workloads.append((workload, lambda grid=grid: grid(x, y, out, N_ELEMENTS), count))
    return workloads


def _cuda_workloads(calls: int) -> list[tuple[str, Callable[[], Any], int]]:
    from dflashdoctor.autotune.fla_workload import gated_delta_rule_forward
    from dflashdoctor.reference.target_pairs import target_forward

    def synchronized(fn: Callable[[int, str], Any]) -> Callable[[], Any]:
        def call() -> Any:
            out = fn(0, "cuda:0")
            torch.cuda.synchronize()
            return out

        call()  # tunes every key once: every timed call is warm
        return call

    return [
        ("fla gated delta rule", synchronized(gated_delta_rule_forward), max(1, calls // 40)),
        ("reference target forward", synchronized(target_forward), max(1, calls // 200)),
    ]


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000, help="calls per sample (run-only workload)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    workloads = _cuda_workloads(args.calls) if args.device == "cuda" else _stub_workloads(args.calls)
    print(f"triton {triton.__version__}, {args.repeats} repeats x 2 samples per mode, medians in microseconds per call")
    print(f"{'workload':26} {'calls':>5} {'plain':>10} {'guarded':>10} {'ratio':>6}")
    for workload, call, calls in workloads:
        samples: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for guarded in (False, True, True, False):
                samples[guarded].append(_per_call(call, calls, guarded))
        plain, guarded = (statistics.median(samples[g]) * 1e6 for g in (False, True))
        print(f"{workload:26} {calls:5d} {plain:10.1f} {guarded:10.1f} {guarded / plain:6.3f}")


if __name__ == "__main__":
    main()
