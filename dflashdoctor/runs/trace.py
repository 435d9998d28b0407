"""A `run` as a timeline a profiler UI opens (Perfetto, chrome://tracing, TensorBoard's trace viewer):
the Chrome trace event format, written as trace.json beside the report.

A track per process (named by its rank and pid), the optimizer steps as spans (a record the agent
coalesced over several steps is one span, named with the steps it covers), every dense flex_attention
kernel, out-of-memory, uncaught exception and the hang as instants on their process's track, and
device memory (allocated, peak) as counters. Times are microseconds from the run's first event.
What happened inside a compile is not here: `TORCH_TRACE` and tlparse show that (the report says how).
"""

from __future__ import annotations

import json
import math
from typing import Any

from dflashdoctor.runs.events import ProcessLog
from dflashdoctor.runs.observations import RunObservations

_MICROSECONDS = 1e6


def _process_events(log: ProcessLog, origin: float) -> list[dict[str, Any]]:
    def at(t: float) -> float:
        return round((t - origin) * _MICROSECONDS, 1)

    pid = log.pid
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": log.label}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": log.rank or 0}},
    ]
    if log.start is not None:
        events.append(
            {"ph": "i", "s": "p", "name": "start", "cat": "process", "pid": pid, "tid": 0, "ts": at(log.start["t"])}
        )
    previous = 0
    for step in log.steps:
        times = step["step_s"]
        first = previous + 1
        previous = step["step"]
        name = f"step {first}" if first == step["step"] else f"steps {first}-{step['step']}"
        if times is not None and math.isfinite(times["mean"]) and 0 < times["mean"] < 1e6:  # JSON has no inf
            duration = times["mean"] * step["covers"] * _MICROSECONDS
            span = {"ph": "X", "name": name, "cat": "step", "pid": pid, "tid": 0, "dur": round(duration, 1)}
            events.append(span | {"ts": round(at(step["t"]) - duration, 1), "args": {"step_s": times}})
        else:
            events.append({"ph": "i", "s": "t", "name": name, "cat": "step", "pid": pid, "tid": 0, "ts": at(step["t"])})
        for device, memory in step["memory"].items():
            counts = {"allocated GiB": memory["allocated_bytes"] / 2**30, "peak GiB": memory["peak_bytes"] / 2**30}
            events.append({"ph": "C", "name": f"memory {device}", "pid": pid, "ts": at(step["t"]), "args": counts})

    def instant(name: str, t: float, category: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "ph": "i",
            "s": "p",
            "name": name,
            "cat": category,
            "pid": pid,
            "tid": 0,
            "ts": at(t),
            "args": args or {},
        }

    for dense in log.dense:
        site = dense["site"]
        where = f"{site.get('file')}:{site.get('line')}" if site else ""
        name = f"dense {dense['kind']} {dense['phase']} {dense['layer'] or ''}".strip()
        events.append(
            instant(name, dense["t"], "dense", {"site": where, "score_matrix_bytes": dense["score_matrix_bytes"]})
        )
    for oom in log.ooms:
        args = {"device": oom["device"], "requested_bytes": oom["requested_bytes"], "free_bytes": oom["free_bytes"]}
        events.append(instant("out of memory", oom["t"], "oom", args))
    for exc in log.exceptions:
        args = {"thread": exc["thread"], "message": exc["message"][:300]}
        events.append(instant(f"uncaught {exc['type']}", exc["t"], "exception", args))
    if log.exit is not None:
        events.append(instant(f"exit ({log.exit['ending']})", log.exit["t"], "exit"))
    return events


def _times(log: ProcessLog) -> list[float]:
    records: list[Any] = [log.start, log.exit, *log.steps, *log.dense, *log.ooms, *log.exceptions]
    return [record["t"] for record in records if record is not None]


def chrome_trace(observations: RunObservations) -> dict[str, Any]:
    """The run's processes as a Chrome trace event document (`traceEvents`, `displayTimeUnit`)."""
    times = [t for log in observations.processes for t in _times(log)]
    origin = min(times, default=0.0)
    events = [event for log in observations.processes for event in _process_events(log, origin)]
    hang = observations.outcome.hang
    if hang:
        last = round((max(times, default=origin) - origin) * _MICROSECONDS, 1)
        name = f"hang: no progress for {hang.get('silent_s')} s"
        events.append({"ph": "i", "s": "g", "name": name, "cat": "hang", "pid": 0, "tid": 0, "ts": last})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"command": " ".join(observations.command), "returncode": observations.outcome.returncode},
    }


def trace_json(observations: RunObservations) -> str:
    return json.dumps(chrome_trace(observations), default=str)
