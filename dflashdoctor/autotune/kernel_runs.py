"""Runs `kernel_trial` once per trial, each in a fresh process that tunes cold, and collects them.

The race lives in tuning, not in compiling, so what must be fresh per trial is every tuning result:
the in-memory tuner caches (a fresh process) and any on disk (`FLA_CACHE_RESULTS=0` and
`TRITON_CACHE_AUTOTUNING=0`, checked after each trial: no `*.autotune.json` may appear). Compiled
binaries may be reused: the series gets one `TRITON_CACHE_DIR` (fresh unless the caller keeps one
across runs), filled by its first trial, so later trials do not spend minutes recompiling every
config of every kernel. The first trial, which compiles, may take most of the time budget.

A trial whose process dies (a segfault, a CUDA error that kills the interpreter, a timeout) is
still a trial: it fails with what the process left on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflashdoctor.autotune.trials import ThreadError, Trial

_STDERR_TAIL = 4000
_MIN_TRIAL_S = 30.0  # kept for each trial still to run


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
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-race-") as tmp:
        work = Path(tmp)
        triton_cache = Path(binaries_dir) if binaries_dir else work / "triton"
        env = {
            **os.environ,
            "TRITON_CACHE_DIR": str(triton_cache),
            "FLA_CACHE_RESULTS": "0",
            "TRITON_CACHE_AUTOTUNING": "0",
        }
        env.pop("TRITON_INTERPRET", None)
        if interpret:
            env["TRITON_INTERPRET"] = "1"
        config = {"target": spec, "threads": threads, "fix": fix, "devices": devices}
        (work / "config.json").write_text(json.dumps(config), encoding="utf-8")
        for index in range(trials):
            out = work / f"out-{index}.json"
            argv = [sys.executable, "-m", "dflashdoctor.autotune.kernel_trial", str(work / "config.json"), str(out)]
            left = budget_s - (time.monotonic() - started) - _MIN_TRIAL_S * (trials - index - 1)
            tuned_before = set(triton_cache.rglob("*.autotune.json"))
            compiled_before = triton_cache.is_dir() and any(triton_cache.iterdir())
            result = _one_trial(argv, env, out, fix=fix, threads=threads, timeout_s=max(_MIN_TRIAL_S, left))
            result["binaries_cached"] = compiled_before  # False: this trial compiled its kernels
            result["tuning_results_on_disk"] = len(set(triton_cache.rglob("*.autotune.json")) - tuned_before)
            results.append(result)
    return results


def _one_trial(
    argv: list[str], env: dict[str, str], out: Path, *, fix: str, threads: int, timeout_s: float
) -> dict[str, Any]:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
        stderr, code = done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        partial = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        stderr, code = f"timed out after {timeout_s} s\n{partial}", None
    if code == 0 and out.exists():
        return json.loads(out.read_text(encoding="utf-8"))
    died = Trial(forced=False, fix=fix, threads=threads)
    message = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
    died.errors.append(
        ThreadError(thread="process", type="ProcessDied", message=message, frame="", traceback=stderr[-_STDERR_TAIL:])
    )
    return died.to_dict()
