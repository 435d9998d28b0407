"""Runs a series of cold trials of `kernel_trial` in trial hosts, and collects them.

The race lives in tuning, not in compiling or importing, so what must be fresh per trial is every
tuning result: the in-memory tuner caches (emptied before each trial by the host, cold_tuners.py)
and any on disk (`FLA_CACHE_RESULTS=0`, `FLA_CACHE_MODE=disabled` and `TRITON_CACHE_AUTOTUNING=0`,
checked after each trial: no `*.autotune.json` may appear). One host runs trial after trial, so the
workload's import (FLA's ops: about 10 s) is paid once per series, not per trial. Compiled binaries
may be reused: the series gets one `TRITON_CACHE_DIR` (fresh unless the caller keeps one across
runs), filled by its first trial, so later trials do not spend minutes recompiling every config of
every kernel. The first trial, which imports and compiles, may take most of the time budget.

A trial whose host dies (a segfault, a CUDA error that kills the interpreter, a timeout) is still a
trial: it fails with what the host left on stderr, and the next trial starts in a fresh host; so
does the trial after one that left a GPU unusable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflashdoctor.autotune.kernel_trial import POISONED, has_binaries, tuning_files
from dflashdoctor.autotune.trials import ThreadError, Trial
from dflashdoctor.probe_configs import KernelTrialConfig, to_json
from dflashdoctor.processes import output_tail

_STDERR_TAIL = 4000
_MIN_TRIAL_S = 30.0  # kept for each trial still to run
_POLL_S = 0.1


def kernel_trials(
    spec: str,
    *,
    threads: int,
    fix: str,
    trials: int,
    devices: list[str],
    interpret: bool,
    budget_s: float,
    binaries_dir: str | None = None,
) -> list[dict[str, Any]]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-race-") as tmp:
        work = Path(tmp)
        triton_cache = Path(binaries_dir) if binaries_dir else work / "triton"
        env = {
            **os.environ,
            "TRITON_CACHE_DIR": str(triton_cache),
            "FLA_CACHE_RESULTS": "0",
            "FLA_CACHE_MODE": "disabled",
            "TRITON_CACHE_AUTOTUNING": "0",
        }
        env.pop("TRITON_INTERPRET", None)
        if interpret:
            env["TRITON_INTERPRET"] = "1"
        config = KernelTrialConfig(target=spec, threads=threads, fix=fix, devices=devices, trials=trials)
        (work / "config.json").write_text(to_json(config), encoding="utf-8")

        def allowance(index: int) -> float:
            """Seconds trial `index` may take from now: what is left, less the least each later trial keeps."""
            return max(_MIN_TRIAL_S, budget_s - (time.monotonic() - started) - _MIN_TRIAL_S * (trials - index - 1))

        results: list[dict[str, Any]] = []
        while len(results) < trials:
            first = len(results)
            results += _host(work, env, first, trials, allowance, fix=fix, threads=threads, triton_cache=triton_cache)
    return results


def _host(
    work: Path,
    env: dict[str, str],
    first: int,
    trials: int,
    allowance: Callable[[int], float],
    *,
    fix: str,
    threads: int,
    triton_cache: Path,
) -> list[dict[str, Any]]:
    """One trial host from trial `first` on: every trial it finished, then (if it died or ran out of
    time before the series ended) the trial it was in, as failed."""
    config = work / "config.json"
    argv = [sys.executable, "-m", "dflashdoctor.autotune.kernel_trial", str(config), str(work), str(first)]
    stderr_path = work / f"host-{first}.stderr"
    compiled_before = has_binaries(triton_cache)
    tuned_before = tuning_files(triton_cache)
    results: list[dict[str, Any]] = []
    with stderr_path.open("w+b") as stderr:
        host = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        index, allowed = first, allowance(first)
        trial_started = time.monotonic()
        deadline = trial_started + allowed
        while index < trials:
            out = work / f"out-{index}.json"
            if out.exists():
                results.append(json.loads(out.read_text(encoding="utf-8")))
                compiled_before = has_binaries(triton_cache)
                tuned_before = tuning_files(triton_cache)
                index, allowed = index + 1, allowance(index + 1)
                trial_started = time.monotonic()
                deadline = trial_started + allowed
                continue
            code = host.poll()
            timed_out = code is None and time.monotonic() > deadline
            if timed_out:
                host.kill()
                host.wait()
            if code is not None or timed_out:
                if (work / f"out-{index}.json").exists():  # written just before it exited
                    continue
                if code == POISONED:  # it finished its trial and left the device unusable
                    break
                died = _died(
                    output_tail(stderr_path, 2 * _STDERR_TAIL), code, timed_out, allowed, fix=fix, threads=threads
                )
                died["fresh_process"] = index == first
                died["binaries_cached"] = compiled_before
                after = tuning_files(triton_cache)
                died["tuning_results_on_disk"] = len(after - tuned_before)
                # what the host would have said of its tuners died with it: nothing counted as cleared,
                # benchmarked or entered warm, and the trial's time is the doctor's own clock
                died.update(tuning_entries_cleared=0, benchmarked={}, entered_warm=[])
                died["wall_s"] = round(time.monotonic() - trial_started, 3)
                results.append(died)
                break
            time.sleep(_POLL_S)
        if host.poll() is None:  # the series is over: it is exiting, or it hangs past its last trial
            try:
                host.wait(timeout=30)
            except subprocess.TimeoutExpired:
                host.kill()
                host.wait()
    return results


def _died(
    stderr: str, code: int | None, timed_out: bool, allowed_s: float, *, fix: str, threads: int
) -> dict[str, Any]:
    """The trial a host was in when it died or ran out of time, as a failed trial."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if timed_out:
        message = f"timed out after {allowed_s:.0f} s"
    elif code is not None and code < 0:
        message = f"killed by {_signal_name(-code)}"
    else:
        message = f"exit status {code}"
    died = Trial(forced=False, fix=fix, threads=threads)
    died.errors.append(
        ThreadError(
            thread="process",
            type="ProcessDied",
            message=f"{message}: {last}" if last else message,
            frame="",
            traceback=stderr[-_STDERR_TAIL:],
        )
    )
    return died.to_dict()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
