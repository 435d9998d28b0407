"""One trial of a real autotuned workload shared by threads, in a process of its own.

    python -m dflashdoctor.autotune.kernel_trial CONFIG.json OUT.json

Autotuners are module globals, so only a fresh process gives fresh in-memory tuning caches; the
parent also gives it a fresh TRITON_CACHE_DIR and FLA_CACHE_RESULTS=0, so no tuning result comes
from disk: every trial tunes cold, where the race lives. The workload is a TARGET callable
`fn(worker, device) -> tensor`; the threads start together, worker i on `devices[i % len(devices)]`,
under an AutotunerGuard (which serializes for the `lock` fix; a shared lock serializes the callers
for `sequential`). Afterwards each worker's call is repeated alone (warm by then) and compared.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from dflashdoctor.autotune.trials import Trial, outputs_equal, run_threads
from dflashdoctor.targets import resolve


def run_kernel_trial(spec: str, threads: int, fix: str, devices: list[str]) -> Trial:
    target, _, _ = resolve(spec)

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


def main() -> None:
    config_path, out_path = sys.argv[1], sys.argv[2]
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    trial = run_kernel_trial(config["target"], config["threads"], config["fix"], config["devices"])
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(trial.to_dict(), handle, default=str)


if __name__ == "__main__":
    main()
