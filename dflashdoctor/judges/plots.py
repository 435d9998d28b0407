"""Values per optimizer step, for a run's process: CUDA memory and step time, with the step where a
dense flex_attention kernel first ran, or memory ran out, marked. Worded here once for the run judge
and for `show` (a report written before sections carried plots keeps its per-step peaks).

A step record names its step; after the first steps one record covers many (the agent writes so
much per hour, not per step), and carries those steps' mean time."""

from __future__ import annotations

import bisect
from typing import Any

from dflashdoctor.records import LoggedDense, OomEvent, StepEvent
from dflashdoctor.report import Line, Mark, Plot

_POINTS = 400  # drawn per line: a longer run is thinned evenly, its last step always kept


def _thinned(points: list[list[float]]) -> list[list[float]]:
    if len(points) <= _POINTS:
        return points
    every = -(-len(points) // _POINTS)
    return [*points[::every][: _POINTS - 1], points[-1]]


def _marks(steps: list[StepEvent], dense: list[LoggedDense], ooms: list[OomEvent]) -> list[Mark]:
    """The step in which a thing happened: the first step not yet finished when it did (for a
    record covering many, the first of them)."""
    marks = []
    times = [float(s.get("t") or 0) for s in steps]
    first_dense = min((float(e["t"]) for e in dense if isinstance(e.get("t"), int | float)), default=None)
    if first_dense is not None:
        after = bisect.bisect_right(times, first_dense)
        finished = int(steps[after - 1].get("step") or after) if after else 0
        marks.append(Mark(float(finished + 1), "first dense flex kernel"))
    for oom in ooms[:1]:
        done = oom.get("steps")
        if isinstance(done, int):
            marks.append(Mark(float(done + 1), "out of memory"))
    return marks


def step_plots(steps: list[StepEvent], dense: list[LoggedDense], ooms: list[OomEvent]) -> list[Plot]:
    """CUDA memory (peak and allocated per device) and seconds per step; nothing without steps."""
    if not steps and not ooms:
        return []
    marks = _marks(steps, dense, ooms)
    memory: dict[str, list[list[float]]] = {}
    for position, step in enumerate(steps, start=1):
        index = int(step.get("step") or position)
        for device, stats in (step.get("memory") or {}).items():
            for name, value in (("peak", stats.get("peak_bytes")), ("allocated", stats.get("allocated_bytes"))):
                if isinstance(value, int | float):
                    memory.setdefault(f"{name} {device}", []).append([index, value])
    plots = []
    if memory or marks:
        lines = [Line(label, _thinned(points)) for label, points in memory.items()]
        plots.append(Plot(title="CUDA memory per step", unit="bytes", x_label="step", lines=lines, marks=marks))
    durations = _durations(steps)
    if durations:
        line = Line("seconds per step", _thinned(durations))
        plots.append(Plot(title="step time", unit="seconds", x_label="step", lines=[line], marks=marks))
    return plots


def _durations(steps: list[StepEvent]) -> list[list[float]]:
    """Seconds per step: a record's own mean; else (events of an older agent, a record a step) the
    time from the step before it. The first step has none."""
    out = []
    for position, step in enumerate(steps):
        index = int(step.get("step") or position + 1)
        summary = step.get("step_s")
        mean = summary.get("mean") if isinstance(summary, dict) else None
        if isinstance(mean, int | float):
            out.append([index, float(mean)])
        elif position and "step_s" not in step:
            took = float(step.get("t") or 0) - float(steps[position - 1].get("t") or 0)
            if took >= 0:
                out.append([index, took])
    return out


def peak_plot(peaks: list[Any]) -> list[Plot]:
    """The per-step peaks an older report kept (the last steps of its run)."""
    points = [[i, p] for i, p in enumerate(peaks, start=1) if isinstance(p, int | float)]
    if not points:
        return []
    return [Plot(title="CUDA memory per step (peak)", unit="bytes", x_label="step", lines=[Line("peak", points)])]
