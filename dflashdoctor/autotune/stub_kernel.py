"""A real triton autotuned kernel that runs without a GPU: the race's reproduction workload.

The kernel is a vector add under `triton.autotune` with two configs, so every cold key is
benchmarked, which is where the race lives. It runs in triton's interpreter (TRITON_INTERPRET=1,
set by the caller before the kernel is made: the `triton.jit` decorator reads it), on CPU tensors.
The interpreter itself is not thread-safe, so launches and benchmark calls are serialized by one
lock here; that lock is around the kernel body only, never around `Autotuner.run`, so the
autotuner's own state stays as shared as it is on a GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

N_ELEMENTS = 512
_INTERPRETER = threading.Lock()

BenchHook = Callable[[], None]  # called inside each benchmark, before the kernel runs


def _jit_kernel() -> Any:
    import triton
    import triton.language as tl

    if not triton.knobs.runtime.interpret:
        raise RuntimeError("the stub kernel needs TRITON_INTERPRET=1 set before it is made (triton.jit reads it then)")

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        x = tl.load(x_ptr + offsets, mask=inside)
        y = tl.load(y_ptr + offsets, mask=inside)
        tl.store(out_ptr + offsets, x + y, mask=inside)

    return add_kernel


class _Serialized:
    """The interpreted kernel with its launches behind the interpreter lock; everything else passes."""

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel

    def run(self, *args: Any, **kwargs: Any) -> Any:
        with _INTERPRETER:
            return self._kernel.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


def autotuned_add(bench_hook: BenchHook) -> Any:
    """A fresh autotuner (empty tuning cache) around the add kernel; `bench_hook` runs inside every
    benchmark call, where a scheduler can hold a thread mid-tuning."""
    import triton

    def do_bench(fn: Callable[[], None], quantiles: Any = None, **_: Any) -> list[float]:
        bench_hook()
        started = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - started
        return [elapsed, elapsed, elapsed]

    configs = [triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})]
    tuner = triton.autotune(configs=configs, key=["n"], do_bench=do_bench)(_jit_kernel())
    tuner.fn = _Serialized(tuner.fn)
    return tuner


def launch(tuner: Any, seed: int) -> torch.Tensor:
    """One call of the autotuned kernel on inputs made from `seed`; returns the output."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N_ELEMENTS, generator=generator)
    y = torch.randn(N_ELEMENTS, generator=generator)
    out = torch.empty(N_ELEMENTS)
    tuner[lambda meta: ((N_ELEMENTS + meta["BLOCK"] - 1) // meta["BLOCK"],)](x, y, out, N_ELEMENTS)
    return out


_SHARED: list[Any] = []  # one module-global autotuner, as FLA keeps its kernels
_SHARED_LOCK = threading.Lock()


def shared_add(worker: int, device: str) -> torch.Tensor:
    """A race TARGET (`fn(worker, device)`) over one module-global autotuner, built on first use:
    the shape of FLA's kernels, without a GPU (`device` must be cpu: the interpreter runs it)."""
    if device != "cpu":
        raise ValueError(f"the stub kernel runs in triton's interpreter on the CPU, not on {device}")
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(autotuned_add(lambda: None))
    return launch(_SHARED[0], worker)
