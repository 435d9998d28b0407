"""Watching the running command: a progress line per rank, the hang watchdog, Ctrl-C.

Progress is any event from any instrumented process (the agent's sampler writes one whenever a
thread runs Python). When none comes for `hang_timeout_s`, every live instrumented process's stacks
are taken and the run is stopped: SIGTERM to the whole process group (the agent snapshots on it),
SIGKILL after a grace period. Ctrl-C is forwarded as SIGINT, then the same stop.

The watch costs the program nothing it could measure: it sleeps until something is due (the
command's end, said by the launcher; a signal; the next progress line; the moment a silence would
become a hang; the deadline), on a thread of its own that steps aside (runs/priority.py). Nothing
is polled: a run of a day wakes it a few thousand times in all.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflashdoctor.leftovers import stop_leftovers
from dflashdoctor.processes import pid_alive
from dflashdoctor.records import HangRecord, LeftRunningRecord
from dflashdoctor.runs.events import LogReader, last_activity
from dflashdoctor.runs.launch import Launched
from dflashdoctor.runs.priority import step_aside
from dflashdoctor.runs.stacks import dump_stacks

if TYPE_CHECKING:
    from _typeshed import HasFileno

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
    launcher, but the same stop. Each one caught also makes `fileno()` readable, which wakes a watch
    sleeping in `select` on it (the handler runs on the main thread; the watch may sleep on another)."""

    _CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}
        self._woken, self._wake = os.pipe()
        os.set_blocking(self._wake, False)

    def __enter__(self) -> Interrupts:
        self._previous = {sig: signal.signal(sig, self._caught) for sig in self._CAUGHT}
        return self

    def __exit__(self, *_exc: object) -> None:
        self.restore()
        for fd in (self._woken, self._wake):
            os.close(fd)

    def fileno(self) -> int:
        return self._woken

    def _caught(self, signum: int, _frame: Any) -> None:
        self.signum = self.signum or signum
        with contextlib.suppress(OSError):  # a full pipe is readable already
            os.write(self._wake, b"!")

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
        devices = step.get("memory", {}).values() if step else ()
        memory = max((m.get("peak_bytes", 0) for m in devices), default=0)
        text = f"{log.label}: step {step['step'] if step else 0}"
        if memory:
            text += f", peak {memory / 2**30:.2f} GiB"
        if log.dense:
            text += f", {len(log.dense)} dense flex kernels"
        parts.append(text)
    return " | ".join(parts)


@dataclass
class _Seen:
    """What the watch thread saw that ends the watch, for the main thread to act on."""

    why: str = "ended"  # "ended", "interrupted", "hung" or "late"
    silent_s: float = 0.0
    activity: dict[int, float] = field(default_factory=dict)
    error: BaseException | None = None


def _wait(
    child: Launched,
    reader: LogReader,
    interrupts: Interrupts,
    hang_timeout_s: float | None,
    deadline_s: float | None,
    outcome: Outcome,
    seen: _Seen,
) -> None:
    """Sleep until something is due, deal with it, sleep again, until the command ends or must be
    stopped. Runs on the watch thread, stepped aside."""
    step_aside()
    events = reader.events
    started = time.monotonic()
    last_progress_wall = time.time()
    last_line, next_line = "", started + _PROGRESS_LINE_EVERY_S
    sleeps_on: list[HasFileno] = [child, interrupts]
    while child.poll() is None:
        now = time.monotonic()
        due = [next_line]
        if hang_timeout_s is not None:  # when the silence so far would become a hang
            due.append(now + max(0.0, last_progress_wall + hang_timeout_s - time.time()))
        if deadline_s is not None:
            due.append(started + deadline_s)
        ready, _, _ = select.select(sleeps_on, [], [], max(0.0, min(due) - now))
        if interrupts.signum:
            seen.why = "interrupted"
            return
        if child in ready:
            continue  # the launcher said something: the loop's poll reads it
        now = time.monotonic()
        if now >= next_line:
            line = _progress_line(reader)
            if line and line != last_line:
                print(f"dflashdoctor run: {line}", file=sys.stderr, flush=True)
                outcome.progress_lines.append(line)
                last_line = line
            next_line = now + _PROGRESS_LINE_EVERY_S
        activity = last_activity(events)
        last_progress_wall = max([last_progress_wall, *activity.values()])
        silent = time.time() - last_progress_wall
        hung = hang_timeout_s is not None and silent >= hang_timeout_s
        late = deadline_s is not None and now - started >= deadline_s
        if hung or late:
            seen.why, seen.silent_s, seen.activity = ("late" if late else "hung"), silent, activity
            return


def _take_stacks(child: Launched, reader: LogReader, seen: _Seen, ran_s: float, deadline_s: float | None) -> HangRecord:
    """Every live instrumented process's stacks, before the run is stopped for a hang or its deadline."""
    live = [pid for pid in seen.activity if _ours(pid, child.pid)]
    why = f"still running after {ran_s:.0f} s" if seen.why == "late" else f"no progress for {seen.silent_s:.0f} s"
    print(
        f"dflashdoctor run: {why}: taking the stacks of {len(live)} processes, then stopping the run",
        file=sys.stderr,
        flush=True,
    )
    hang: HangRecord = {
        "silent_s": round(seen.silent_s, 1),
        "stacks": {pid: dump_stacks(pid, reader.events) for pid in live},
    }
    if seen.why == "late" and deadline_s is not None:
        hang["deadline_s"] = deadline_s
    return hang


def _watched(target: Any, *args: Any) -> None:
    seen: _Seen = args[-1]
    try:
        target(*args)
    except BaseException as exc:  # handed to the main thread, raised there
        seen.error = exc


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
    130, as during its probes); else the outcome says `interrupted`.

    The waiting happens on a thread of its own, stepped aside; what it decides (stop, take the
    stacks) is done here, at the doctor's own priority."""
    started = time.monotonic()
    outcome = Outcome(returncode=None, duration_s=0.0)
    seen = _Seen()
    try:
        waiter = threading.Thread(
            target=_watched,
            args=(_wait, child, reader, interrupts, hang_timeout_s, deadline_s, outcome, seen),
            name="dflashdoctor-watch",
            daemon=True,
        )
        waiter.start()
        waiter.join()  # a signal's handler still runs here, on the main thread, and wakes the waiter
        if seen.error is not None:
            raise seen.error
        if seen.why == "interrupted":
            outcome.interrupted = outcome.stopped_by_doctor = True
            _stop(child, signal.SIGINT)
        elif seen.why in ("hung", "late"):
            outcome.hang = _take_stacks(child, reader, seen, time.monotonic() - started, deadline_s)
            outcome.stopped_by_doctor = True
            _stop(child, signal.SIGTERM)
    finally:
        interrupts.restore()
    outcome.returncode = child.wait()
    outcome.duration_s = round(time.monotonic() - started, 3)
    outcome.left_running = stop_leftovers(child.lineage())
    if passes_interrupt and interrupts.signum:
        signal.raise_signal(interrupts.signum)
    return outcome
