"""Runs `kernel_trial` once per trial, each in a fresh process with fresh caches, and collects them.

A trial whose process dies (a segfault, a CUDA error that kills the interpreter, a timeout) is
still a trial: it fails with what the process left on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dflashdoctor.autotune.trials import ThreadError, Trial

_STDERR_TAIL = 4000


def kernel_trials(
    spec: str, *, threads: int, fix: str, trials: int, devices: list[str], interpret: bool, timeout_s: float
) -> list[dict[str, Any]]:
    results = []
    for _ in range(trials):
        with tempfile.TemporaryDirectory(prefix="dflashdoctor-race-") as tmp:
            work = Path(tmp)
            env = {**os.environ, "TRITON_CACHE_DIR": str(work / "triton"), "FLA_CACHE_RESULTS": "0"}
            env.pop("TRITON_INTERPRET", None)
            if interpret:
                env["TRITON_INTERPRET"] = "1"
            config = {"target": spec, "threads": threads, "fix": fix, "devices": devices}
            (work / "config.json").write_text(json.dumps(config), encoding="utf-8")
            argv = [sys.executable, "-m", "dflashdoctor.autotune.kernel_trial", str(work / "config.json")]
            argv.append(str(work / "out.json"))
            try:
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
                stderr, code = done.stderr, done.returncode
            except subprocess.TimeoutExpired as exc:
                stderr, code = f"timed out after {timeout_s} s\n{exc.stderr or ''}", None
            out = work / "out.json"
            if code == 0 and out.exists():
                results.append(json.loads(out.read_text(encoding="utf-8")))
                continue
            died = Trial(forced=False, fix=fix, threads=threads)
            message = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
            died.errors.append(
                ThreadError(
                    thread="process", type="ProcessDied", message=message, frame="", traceback=stderr[-_STDERR_TAIL:]
                )
            )
            results.append(died.to_dict())
    return results
