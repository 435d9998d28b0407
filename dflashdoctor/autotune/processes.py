"""The same workload with one process per worker, through torch.distributed: nothing is shared.

Each rank builds its own autotuner (its own tuning cache and per-call state), makes the same call
a thread would, checks its output against a single-process run, and the ranks gather what they
saw (pid, the autotuner's id, the result) with gloo. That is the layout the race's first fix
recommends: one process per GPU pair (torchrun), instead of threads sharing module globals.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dflashdoctor.autotune.stub_kernel import autotuned_add, launch


def _worker(rank: int, world: int, rendezvous: str, seed: int, results: Any) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        expected = launch(autotuned_add(lambda: None), seed + rank)
        tuner = autotuned_add(lambda: None)
        error = None
        try:
            equal = bool(torch.equal(launch(tuner, seed + rank), expected))
        except Exception as exc:  # the workload failed in this rank: reported, not raised
            equal, error = False, f"{type(exc).__name__}: {exc}"
        mine = {"rank": rank, "pid": os.getpid(), "autotuner_id": id(tuner), "output_equal": equal, "error": error}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            results.put(gathered)
    finally:
        dist.destroy_process_group()


def run_processes(world: int, seed: int) -> dict[str, Any]:
    """Spawn `world` ranks (gloo); what each saw, and whether any autotuner was shared."""
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-race-") as tmp:
        rendezvous = os.path.join(tmp, "rendezvous")
        mp.start_processes(_worker, args=(world, rendezvous, seed, results), nprocs=world, start_method="spawn")
    ranks = results.get()
    pids = {r["pid"] for r in ranks}
    return {
        "world": world,
        "backend": "gloo",
        "ranks": ranks,
        "distinct_processes": len(pids),
        "failures": sum(1 for r in ranks if r["error"] or not r["output_equal"]),
    }
