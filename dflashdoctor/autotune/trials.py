"""Threads sharing one autotuner: forced and natural trials, with or without a fix.

A forced trial makes the race happen whenever the installed autotuner has it: every thread starts
together on a cold autotuner, and the first one to benchmark is held inside its first benchmark until
every other thread has finished its whole call (which, in triton's `Autotuner.run`, ends with
`self.nargs = None`); then it resumes and reads the shared state. A fix that keeps the others out
(a lock, sequential callers) means they cannot finish while it is held, so it waits at most
`patience` seconds and goes on. A natural trial only starts the threads together, with a seeded
jitter, and lets them run.

Every trial gets a fresh autotuner (empty tuning cache), runs under an AutotunerGuard (which also
serializes for the `lock` fix), and compares each thread's output with a single-threaded run.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any

import torch

from dflashdoctor.autotune import FIXES
from dflashdoctor.hooks.autotuner_guard import AutotunerGuard, kernel_name
from dflashdoctor.records import ConcurrentEntryRecord
from dflashdoctor.redaction import redact_text

_JITTER_S = 0.002


@dataclass
class ThreadError:
    thread: str
    type: str
    message: str
    frame: str  # file:line in function, innermost
    traceback: str
    kernel: str | None = None  # the autotuned kernel whose run raised
    launch_site: str | None = None  # file:line in function that launched it (`kernel[grid](...)`)


@dataclass
class Trial:
    forced: bool
    fix: str
    threads: int
    errors: list[ThreadError] = field(default_factory=list)
    outputs_equal: bool | None = None  # every finished thread's output equals the single-threaded one
    concurrent_entries: list[ConcurrentEntryRecord] = field(default_factory=list)
    autotuners_entered: list[str] = field(default_factory=list)  # every autotuned kernel the calls reached
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.errors) or self.outputs_equal is False

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed": self.failed}


class _ForcedSchedule:
    """Holds the first thread to benchmark until the others have finished (or patience runs out)."""

    def __init__(self, threads: int, patience_s: float) -> None:
        self.threads = threads
        self.patience_s = patience_s
        self.held: str | None = None
        self._finished = 0
        self._lock = threading.Lock()
        self._release = threading.Event()

    def bench_hook(self) -> None:
        me = threading.current_thread().name
        with self._lock:
            hold = self.held is None
            if hold:
                self.held = me
        if hold:
            self._release.wait(self.patience_s)

    def finished(self) -> None:
        with self._lock:
            if threading.current_thread().name != self.held:
                self._finished += 1
            if self._finished >= self.threads - 1 and self.held is not None:
                self._release.set()


def _failing_kernel(tb: TracebackType | None) -> str | None:
    """The autotuner a traceback ran through, innermost first: the `self` of its run or benchmark."""
    kernel = None
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and any(c.__name__ == "Autotuner" for c in type(owner).__mro__):
            kernel = kernel_name(owner)
        tb = tb.tb_next
    return kernel


def _launch_site(frames: traceback.StackSummary) -> str | None:
    """The frame that launched the autotuned kernel: the one before triton's launcher (`jit.py`)."""
    launches = [i for i, f in enumerate(frames) if f.filename.replace("\\", "/").endswith("triton/runtime/jit.py")]
    if not launches or launches[-1] == 0:
        return None
    caller = frames[launches[-1] - 1]
    return f"{caller.filename}:{caller.lineno} in {caller.name}"


def thread_error(exc: BaseException) -> ThreadError:
    """The exception a worker thread ended with, with its innermost frame, the autotuned kernel it
    was in and the line that launched that kernel."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return ThreadError(
        thread=threading.current_thread().name,
        type=type(exc).__name__,
        message=redact_text(str(exc))[:500],  # the workload's own text: it may quote a secret
        frame=f"{last.filename}:{last.lineno} in {last.name}" if last else "",
        traceback=redact_text("".join(traceback.format_exception(exc)))[-4000:],
        kernel=_failing_kernel(exc.__traceback__),
        launch_site=_launch_site(frames),
    )


def run_threads(
    call: Callable[[int], Any],
    *,
    threads: int,
    fix: str,
    forced: bool = False,
    delays: list[float] | None = None,
    after_call: Callable[[], None] | None = None,
) -> tuple[Trial, list[Any]]:
    """Start `threads` threads together, each making `call(index)` once under `fix`, inside an
    AutotunerGuard (serializing for `lock`); the trial (errors, overlaps, time) and each output.
    `after_call` runs in each thread when its call is over, failed or not."""
    if fix not in FIXES:
        raise ValueError(f"unknown fix {fix!r}; expected one of {', '.join(FIXES)}")
    start = threading.Barrier(threads)
    sequential = threading.Lock() if fix == "sequential" else None
    outputs: list[Any] = [None] * threads
    trial = Trial(forced=forced, fix=fix, threads=threads)

    def worker(index: int) -> None:
        start.wait()
        time.sleep(delays[index] if delays else 0.0)
        try:
            with sequential if sequential is not None else contextlib.nullcontext():
                outputs[index] = call(index)
        except Exception as exc:  # the race: kept as the trial's evidence
            trial.errors.append(thread_error(exc))
        finally:
            if after_call is not None:
                after_call()

    started = time.perf_counter()
    with AutotunerGuard(serialize=fix == "lock") as guard:
        pool = [threading.Thread(target=worker, args=(i,), name=f"worker-{i}") for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    trial.duration_s = round(time.perf_counter() - started, 3)
    trial.concurrent_entries = [event.to_dict() for event in guard.events]
    trial.autotuners_entered = guard.kernels_entered()
    return trial, outputs


def outputs_equal(outputs: list[Any], expected: Callable[[int], torch.Tensor]) -> bool | None:
    """Every finished thread's output against `expected(index)`; None when no thread finished."""
    finished = [(i, out) for i, out in enumerate(outputs) if isinstance(out, torch.Tensor)]
    return all(torch.equal(out, expected(i)) for i, out in finished) if finished else None


def run_trial(
    make_tuner: Callable[[Callable[[], None]], Any],
    launch: Callable[[Any, int], torch.Tensor],
    *,
    threads: int,
    fix: str,
    forced: bool,
    seed: int,
    patience_s: float = 1.0,
) -> Trial:
    """One trial: `threads` threads each make one call of a fresh autotuner built by `make_tuner`
    (given the hook to run inside each benchmark); `launch(tuner, seed)` is one call's output."""
    expected = [launch(make_tuner(lambda: None), seed + i) for i in range(threads)]
    schedule = _ForcedSchedule(threads, patience_s) if forced else None
    tuner = make_tuner(schedule.bench_hook if schedule else lambda: None)
    jitter = random.Random(seed)
    trial, outputs = run_threads(
        lambda index: launch(tuner, seed + index),
        threads=threads,
        fix=fix,
        forced=forced,
        delays=None if forced else [jitter.uniform(0, _JITTER_S) for _ in range(threads)],
        after_call=schedule.finished if schedule else None,
    )
    trial.outputs_equal = outputs_equal(outputs, expected.__getitem__)
    return trial
