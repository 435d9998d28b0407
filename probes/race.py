"""Probe: does the installed triton autotuner break when threads share it, and does the fix hold?

Runs in its own process (in the gate, one forked from the probe host) with TRITON_INTERPRET=1 for
the stub kernel, set by the doctor: the `triton.jit` decorator reads it as it makes the kernel.
Observations:
- the static audit of the installed autotuner classes (per-call state on the shared instance);
- a forced trial without a fix (the reproduction: the race shows whenever the installed autotuner
  has it), then, with a fix, a forced trial under that fix;
- `trials` natural trials under the chosen fix (a failure rate);
- with `processes`, the same workload with one process per worker over gloo.
With `--kernel fla`, `reference` (the reference target's forwards, reference/target_pairs.py) or a
TARGET, real kernels instead: `trials` trials in one trial host, each tuning cold
(kernel_runs.py), under the chosen fix; FLA's live autotuned kernels are listed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

from dflashdoctor.autotune import FLA_TARGET
from dflashdoctor.autotune.audit import audit_installed, live_autotuners
from dflashdoctor.autotune.kernel_runs import kernel_trials
from dflashdoctor.autotune.processes import run_processes
from dflashdoctor.autotune.stub_kernel import autotuned_add, launch
from dflashdoctor.autotune.trials import run_trial
from dflashdoctor.errors import MissingPackage
from dflashdoctor.observations import RaceObservations, dump
from dflashdoctor.probe_configs import RaceConfig
from dflashdoctor.probe_support import UsageError, probe_main
from dflashdoctor.reference import target_pairs
from dflashdoctor.targets import resolve


def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # not installed, or it fails to import here
        return None


def _why_no_fla(kernel: str, gpus: int) -> str | None:
    """Why FLA's autotuners cannot be reached here, or None when they can."""
    runs = "FLA's Triton kernels" if kernel == "fla" else "the reference target's gated DeltaNet layers (FLA's kernels)"
    if not gpus:
        return f"{runs} need a CUDA GPU, and torch sees none here"
    if not target_pairs.fla_importable():
        return f"fla is not importable in the probed interpreter (`pip install fla-core`): {runs} cannot run"
    return None


def _real_kernels(config: RaceConfig, observations: dict[str, Any]) -> None:
    """FLA's, the reference target's or the user's autotuned workload: cold trials in a trial host,
    one thread per GPU if several."""
    import torch

    kernel, gpus = config.kernel, torch.cuda.device_count()
    if kernel in ("fla", "reference"):
        skipped = _why_no_fla(kernel, gpus)
        if skipped:
            observations["kernel_skipped"] = skipped
            return
        observations["live_autotuners"] = live_autotuners("fla")
    else:
        resolve(kernel)  # a TARGET that does not resolve is bad input, before any trial
    threads = config.threads
    devices = [f"cuda:{i}" for i in range(min(gpus, threads))] or ["cpu"]
    observations["devices"] = devices
    if kernel == "reference":
        observations["reference"] = {
            "switch": target_pairs.describe(config.fix),
            **target_pairs.model_info(devices[0]),
        }
    observations["kernel_trials"] = kernel_trials(
        {"fla": FLA_TARGET, "reference": target_pairs.TARGET_SPEC}.get(kernel, kernel),
        threads=threads,
        fix=config.fix,
        trials=max(1, config.trials),
        devices=devices,
        interpret=not gpus,  # no GPU: the target's triton kernels run in the interpreter
        budget_s=config.trials_budget_s,
        binaries_dir=config.binaries_dir,
    )


def run(config: RaceConfig) -> dict[str, Any]:
    if importlib.util.find_spec("triton") is None:
        raise MissingPackage("triton", "triton is not importable in the probed interpreter: `pip install triton`")
    try:
        importlib.import_module("triton")
    except Exception as exc:  # installed but broken: a problem to show, not a probe to skip
        raise UsageError(f"triton is installed but fails to import: {type(exc).__name__}: {exc}") from exc
    threads, fix, seed, kernel = config.threads, config.fix, config.seed, config.kernel
    observations: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "triton": _version("triton"),
        "fla": _version("fla"),
        "kernel": "stub (triton interpreter, 2 configs, vector add)" if kernel == "stub" else kernel,
        "threads": threads,
        "fix": fix,
        "audit": [a.to_dict() for a in audit_installed()],
    }
    if kernel != "stub":
        _real_kernels(config, observations)
        return dump(RaceObservations(**observations))

    def trial(forced: bool, under: str, trial_seed: int) -> dict[str, Any]:
        return run_trial(autotuned_add, launch, threads=threads, fix=under, forced=forced, seed=trial_seed).to_dict()

    observations["forced_unfixed"] = trial(True, "none", seed)
    if fix != "none":
        observations["forced_fixed"] = trial(True, fix, seed)
    observations["natural"] = [trial(False, fix, seed + 1000 * (i + 1)) for i in range(config.trials)]
    if config.processes:
        observations["processes"] = run_processes(config.processes, seed)
    return dump(RaceObservations(**observations))


if __name__ == "__main__":
    probe_main(run, RaceConfig)
