"""Keeping the doctor's watch out of the program's way while the run goes on.

The watch thread waits almost all the time, but when it wakes (a progress line, a hang check) it
must never take a CPU the training step wanted: it asks for the idle scheduling class (it runs only
where a CPU would otherwise idle) and, where the CPUs it may use are several, the last of them (a
program's own pinned threads, OpenMP's bound pool, start from the first). Linux keeps both per
thread, so only the watch thread steps aside: the doctor's main thread, the stack dumpers it starts
and whatever it runs after the watch keep their priority. Elsewhere, and where the kernel refuses,
nothing changes: stepping aside is a courtesy, never a reason for a run to fail.
"""

from __future__ import annotations

import contextlib
import os
import sys


def step_aside() -> None:
    """Lower the calling thread: idle scheduling, else the lowest nice; the last allowed CPU."""
    if sys.platform != "linux":  # elsewhere these act on the whole process
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, 19)
    with contextlib.suppress(AttributeError, OSError):
        allowed = os.sched_getaffinity(0)
        if len(allowed) > 1:
            os.sched_setaffinity(0, {max(allowed)})
