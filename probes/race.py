"""Probe: does the installed triton autotuner break when threads share it, and does the fix hold?

Runs in its own process with TRITON_INTERPRET=1 for the stub kernel (set by the doctor, since the
`triton.jit` decorator reads it at import). Observations:
- the static audit of the installed autotuner classes (per-call state on the shared instance);
- a forced trial without a fix (the reproduction: the race shows whenever the installed autotuner
  has it), then, with a fix, a forced trial under that fix;
- `trials` natural trials under the chosen fix (a failure rate);
- with `processes`, the same workload with one process per worker over gloo.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from dflashdoctor.autotune.audit import audit_installed
from dflashdoctor.autotune.processes import run_processes
from dflashdoctor.autotune.stub_kernel import autotuned_add, launch
from dflashdoctor.autotune.trials import run_trial
from dflashdoctor.probe_support import UsageError, probe_main


def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # not installed, or it fails to import here
        return None


def run(settings: dict[str, Any]) -> dict[str, Any]:
    if settings["kernel"] != "stub":
        raise UsageError(f"--kernel {settings['kernel']} is not available yet; use --kernel stub")
    if _version("triton") is None:
        raise UsageError("triton is not importable in the probed interpreter: `pip install triton`")
    threads, fix, seed = settings["threads"], settings["fix"], settings["seed"]
    observations: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "triton": _version("triton"),
        "fla": _version("fla"),
        "kernel": "stub (triton interpreter, 2 configs, vector add)",
        "threads": threads,
        "fix": fix,
        "audit": [a.to_dict() for a in audit_installed()],
    }

    def trial(forced: bool, under: str, trial_seed: int) -> dict[str, Any]:
        return run_trial(autotuned_add, launch, threads=threads, fix=under, forced=forced, seed=trial_seed).to_dict()

    observations["forced_unfixed"] = trial(True, "none", seed)
    if fix != "none":
        observations["forced_fixed"] = trial(True, fix, seed)
    observations["natural"] = [trial(False, fix, seed + 1000 * (i + 1)) for i in range(settings["trials"])]
    if settings["processes"]:
        observations["processes"] = run_processes(settings["processes"], seed)
    return observations


if __name__ == "__main__":
    probe_main(run)
