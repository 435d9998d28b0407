"""trace.json from records a damaged or hostile process could write: an infinite or NaN step time
and a memory figure of 10**30 bytes still give strict JSON (no Infinity, no NaN) a viewer loads,
the steps named by the optimizer steps they cover."""

from __future__ import annotations

import json

from dflashdoctor.runs.events import ProcessLog
from dflashdoctor.runs.observations import RunObservations
from dflashdoctor.runs.trace import trace_json


def _step(t: float, step: int, covers: int, mean: float, memory: dict) -> dict:
    times = {"mean": mean, "min": 0.0, "max": 0.0}
    return {
        "t": t,
        "pid": 5,
        "rank": 0,
        "kind": "step",
        "step": step,
        "covers": covers,
        "memory": memory,
        "step_s": times,
    }


def _strict(name: str) -> None:
    raise AssertionError(name)


def test_infinite_and_nan_step_times_and_huge_memory_give_strict_json():
    log = ProcessLog(pid=5, rank=0)
    huge = {"cuda:0": {"allocated_bytes": 10**30, "peak_bytes": 1, "reserved_bytes": 0}}
    log.steps += [
        _step(10.0, 3, 3, float("inf"), {}),
        _step(11.0, 4, 1, float("nan"), huge),
        _step(12.5, 5, 1, 1.5, {}),
    ]
    trace = json.loads(trace_json(RunObservations(command=["train.py"], processes=[log])), parse_constant=_strict)
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert [(e["name"], e["ph"]) for e in steps] == [("steps 1-3", "i"), ("step 4", "i"), ("step 5", "X")]
    assert steps[-1]["dur"] == 1.5e6 and steps[-1]["ts"] == 1.0e6  # it ended at 12.5 s: began at 11.0 s
    (track,) = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert track["args"]["name"] == "rank 0 (pid 5)"
