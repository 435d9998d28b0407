"""Watching the running command: a progress line per rank, the hang watchdog, Ctrl-C.

Progress is any event from any instrumented process (the agent's sampler writes one whenever a
thread runs Python). When none comes for `hang_timeout_s`, every live instrumented process's stacks
are taken and the run is stopped: SIGTERM to the whole process group (the agent snapshots on it),
SIGKILL after a grace period. Ctrl-C is forwarded as SIGINT, then the same stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.leftovers import stop_leftovers
from dflashdoctor.processes import pid_alive
from dflashdoctor.records import HangRecord, LeftRunningRecord
from dflashdoctor.runs.events import LogReader, last_activity
from dflashdoctor.runs.launch import Launched
from dflashdoctor.runs.stacks import dump_stacks

_POLL_S = 0.2
_PROGRESS_LINE_EVERY_S = 10.0
_GRACE_S = 10.0


@dataclass
class Outcome:
    returncode: int | None
    duration_s: float
    hang: HangRecord | None = None
    interrupted: bool = False
    stopped_by_doctor: bool = False
    progress_lines: list[str] = field(default_factory=list)
    left_running: list[LeftRunningRecord] = field(default_factory=list)  # stopped by the doctor


class Interrupts:
    """Ctrl-C, SIGTERM and SIGHUP from before the command starts until its watch ends: recorded, not
    raised, so that the command is stopped and what was seen is reported (a doctor stopped stops its
    run too; its terminal gone, the same, not a dead doctor). Caught from before the launcher starts,
    so that one sent as the command starts is not the doctor's own 143 with the command left to the
    launcher, but the same stop."""

    _CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        self._previous = {sig: signal.signal(sig, self._caught) for sig in self._CAUGHT}
        return self

    def __exit__(self, *_exc: object) -> None:
        self.restore()

    def _caught(self, signum: int, _frame: Any) -> None:
        self.signum = self.signum or signum

    def restore(self) -> None:
        """The doctor's own handlers back (once; again is nothing)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def _ours(pid: int, group: int) -> bool:
    """Alive and still in the command's process group: a pid reused by another program since its
    events were written must not get our stack-dump signal (its default action terminates)."""
    try:
        return pid_alive(pid) and os.getpgid(pid) == group
    except OSError:
        return False


def _stop(child: Launched, first: signal.Signals) -> None:
    for sig, wait in ((first, _GRACE_S), (signal.SIGKILL, _GRACE_S)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _progress_line(reader: LogReader) -> str:
    parts = []
    for log in reader.update():
        if log.instrumented is None:
            continue
        step = log.steps[-1] if log.steps else None
        memory = max((m.get("peak_bytes", 0) for m in (step or {}).get("memory", {}).values()), default=0)
        text = f"{log.label}: step {step['step'] if step else 0}"
        if memory:
            text += f", peak {memory / 2**30:.2f} GiB"
        if log.dense:
            text += f", {len(log.dense)} dense flex kernels"
        parts.append(text)
    return " | ".join(parts)


def watch(
    child: Launched,
    reader: LogReader,
    interrupts: Interrupts,
    hang_timeout_s: float | None,
    deadline_s: float | None = None,
    *,
    passes_interrupt: bool = False,
) -> Outcome:
    """Follow the command to its end, reading its events as they come with `reader` (the caller's:
    its last update then reads only what came after, not every line again). `hang_timeout_s`:
    stopped after that long without progress; `deadline_s`: stopped after that long whatever its
    progress (the gate's bound on its run: a loop with no optimizer step never reaches --steps).
    `interrupts`, entered before the command started, are restored as the watch ends.
    `passes_interrupt`: the signal that stopped the run (SIGTERM, Ctrl-C, SIGHUP) is raised again
    once the command and what it left are stopped, for the doctor's own handler (the gate's: 143,
    130, as during its probes); else the outcome says `interrupted`."""
    events = reader.events
    started = time.monotonic()
    outcome = Outcome(returncode=None, duration_s=0.0)
    last_progress_wall = time.time()
    last_line, last_line_t = "", 0.0
    try:
        while child.poll() is None:
            time.sleep(_POLL_S)
            if interrupts.signum:
                outcome.interrupted = outcome.stopped_by_doctor = True
                _stop(child, signal.SIGINT)
                break
            activity = last_activity(events)
            last_progress_wall = max([last_progress_wall, *activity.values()])
            now = time.monotonic()
            if now - last_line_t >= _PROGRESS_LINE_EVERY_S:
                line = _progress_line(reader)
                if line and line != last_line:
                    print(f"dflashdoctor run: {line}", file=sys.stderr, flush=True)
                    outcome.progress_lines.append(line)
                    last_line = line
                last_line_t = now
            silent = time.time() - last_progress_wall
            hung = hang_timeout_s is not None and silent >= hang_timeout_s
            late = deadline_s is not None and now - started >= deadline_s
            if hung or late:
                live = [pid for pid in activity if _ours(pid, child.pid)]
                why = f"still running after {now - started:.0f} s" if late else f"no progress for {silent:.0f} s"
                print(
                    f"dflashdoctor run: {why}: taking the stacks of {len(live)} processes, then stopping the run",
                    file=sys.stderr,
                    flush=True,
                )
                outcome.hang = {"silent_s": round(silent, 1), "stacks": {pid: dump_stacks(pid, events) for pid in live}}
                if late:
                    outcome.hang["deadline_s"] = deadline_s
                outcome.stopped_by_doctor = True
                _stop(child, signal.SIGTERM)
                break
    finally:
        interrupts.restore()
    outcome.returncode = child.wait()
    outcome.duration_s = round(time.monotonic() - started, 3)
    outcome.left_running = stop_leftovers(child.lineage())
    if passes_interrupt and interrupts.signum:
        signal.raise_signal(interrupts.signum)
    return outcome
