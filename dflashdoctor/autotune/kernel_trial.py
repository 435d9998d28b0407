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

import contextlib
import json
import sys
import threading
import time
from typing import Any

import torch

from dflashdoctor.autotune.trials import Trial, thread_error
from dflashdoctor.hooks.autotuner_guard import AutotunerGuard
from dflashdoctor.targets import resolve


def run_kernel_trial(spec: str, threads: int, fix: str, devices: list[str]) -> Trial:
    target, _, _ = resolve(spec)
    trial = Trial(forced=False, fix=fix, threads=threads)
    outputs: list[Any] = [None] * threads
    start = threading.Barrier(threads)
    sequential = threading.Lock() if fix == "sequential" else None

    def worker(index: int) -> None:
        device = devices[index % len(devices)]
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        start.wait()
        try:
            with sequential if sequential is not None else contextlib.nullcontext():
                outputs[index] = target(index, device)
                if device.startswith("cuda"):
                    torch.cuda.synchronize(device)
        except Exception as exc:  # the race: kept as the trial's evidence
            trial.errors.append(thread_error(exc))

    started = time.perf_counter()
    with AutotunerGuard(serialize=fix == "lock") as guard:
        pool = [threading.Thread(target=worker, args=(i,), name=f"worker-{i}") for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    trial.duration_s = round(time.perf_counter() - started, 3)
    trial.concurrent_entries = [event.to_dict() for event in guard.events]
    finished = [(i, out) for i, out in enumerate(outputs) if isinstance(out, torch.Tensor)]
    if finished:
        again = {i: target(i, devices[i % len(devices)]) for i, _ in finished}  # alone, warm
        trial.outputs_equal = all(torch.equal(out, again[i]) for i, out in finished)
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
