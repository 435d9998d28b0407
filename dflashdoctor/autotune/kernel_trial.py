"""Trials of a real autotuned workload shared by threads, one after another in one trial host.

    python -m dflashdoctor.autotune.kernel_trial CONFIG.json OUT_DIR FIRST

CONFIG.json is a probe_configs.KernelTrialConfig, loaded strictly. The host imports the TARGET once
(for FLA, `fla.ops`: about 10 s), then runs trials FIRST, FIRST+1, ... up to the config's `trials`,
writing `out-<i>.json` as each ends. Before each trial every live autotuner is made cold
(cold_tuners.py) and the parent gave the series TRITON_CACHE_AUTOTUNING=0 and
FLA_CACHE_RESULTS=0, so every trial tunes every key afresh, where the race lives; each trial checks
both (what it benchmarked, any `*.autotune.json` that appeared on disk). The workload is a TARGET
callable `fn(worker, device) -> tensor`; the threads start together, worker i on
`devices[i % len(devices)]`, under an AutotunerGuard (which serializes for the `lock` fix; a shared
lock serializes the callers for `sequential`). Afterwards each worker's call is repeated alone
(warm by then) and compared.

A trial that leaves a GPU unusable (a sticky CUDA error) ends the host with POISONED once its
result is written: the parent starts a fresh host for the next trial. A host that dies mid-trial is
seen by the parent (kernel_runs.py), which records that trial and goes on in a fresh host.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dflashdoctor.autotune.cold_tuners import benchmarked, entered_warm, live_tuners, make_cold
from dflashdoctor.autotune.trials import Trial, outputs_equal, run_threads
from dflashdoctor.probe_configs import KernelTrialConfig, load_config
from dflashdoctor.targets import resolve

POISONED = 4  # exit status: the last trial left a device unusable; the next needs a fresh process


def run_kernel_trial(target: Any, threads: int, fix: str, devices: list[str]) -> Trial:
    def call(index: int) -> Any:
        device = devices[index % len(devices)]
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        out = target(index, device)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        return out

    trial, outputs = run_threads(call, threads=threads, fix=fix)
    trial.outputs_equal = outputs_equal(outputs, call)  # each call again, alone (warm by now)
    return trial


def tuning_files(triton_cache: Path) -> set[Path]:
    """The tuning results stored under a Triton cache (none may appear while trials tune cold)."""
    return set(triton_cache.rglob("*.autotune.json")) if triton_cache.is_dir() else set()


def has_binaries(triton_cache: Path) -> bool:
    """Whether a trial starting now finds compiled kernels (False: it compiles them)."""
    return triton_cache.is_dir() and any(triton_cache.iterdir())


def _devices_usable(devices: list[str]) -> str | None:
    """None when every CUDA device still answers; else what the first one that does not said."""
    for device in devices:
        if device.startswith("cuda"):
            try:
                torch.cuda.synchronize(device)
            except Exception as exc:  # a sticky error: this process can run nothing more on it
                return f"{device}: {type(exc).__name__}: {str(exc)[:300]}"
    return None


def one_trial(target: Any, config: KernelTrialConfig, triton_cache: Path, fresh_process: bool) -> dict[str, Any]:
    """One cold trial in this process, with what shows it was cold."""
    cleared = make_cold(live_tuners())
    tuned_before = tuning_files(triton_cache)
    compiled_before = has_binaries(triton_cache)
    started = time.perf_counter()
    trial = run_kernel_trial(target, config.threads, config.fix, config.devices)
    result = trial.to_dict()
    tuners = live_tuners()
    tuned = benchmarked(tuners)
    result.update(
        fresh_process=fresh_process,  # True: the first trial of its host, which imported the workload
        tuning_entries_cleared=cleared,  # what earlier calls had left, emptied before this trial
        benchmarked=tuned,  # kernel -> keys it tuned in this trial
        # only where no thread died mid-tuning, which leaves a cold tuner without its timings
        entered_warm=[] if trial.errors else entered_warm(trial.autotuners_entered, tuners, tuned),
        binaries_cached=compiled_before,  # False: this trial compiled its kernels
        tuning_results_on_disk=len(tuning_files(triton_cache) - tuned_before),
        wall_s=round(time.perf_counter() - started, 3),
    )
    return result


def _write_whole(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, default=str), encoding="utf-8")
    os.replace(tmp, path)


def main() -> int:
    config_path, out_dir, first = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    config = load_config(KernelTrialConfig, json.loads(config_path.read_text(encoding="utf-8")))
    target, _, _ = resolve(config.target)
    triton_cache = Path(os.environ["TRITON_CACHE_DIR"])
    for index in range(first, config.trials):
        result = one_trial(target, config, triton_cache, fresh_process=index == first)
        broken = _devices_usable(config.devices)
        if broken:
            result["device_unusable"] = broken
        _write_whole(out_dir / f"out-{index}.json", result)
        if broken:
            return POISONED
    return 0


if __name__ == "__main__":
    sys.exit(main())
