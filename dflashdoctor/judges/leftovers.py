"""The finding for processes a job left running once it had exited (found and stopped by
dflashdoctor/leftovers.py): the same for a `run` command and for a probe's target or script."""

from __future__ import annotations

from dflashdoctor.codes import finding
from dflashdoctor.records import LeftRunningRecord
from dflashdoctor.report import Finding


def left_running_finding(left: list[LeftRunningRecord], whose: str) -> Finding:
    """`whose` ("the command", "probe trace-attention") exited, but processes it started still ran: a
    job that leaves a daemon writing (or holding a GPU) after its report is not over."""
    named = "; ".join(f"pid {p.get('pid')}: {p.get('command')}" for p in left[:5]) + (" ..." if len(left) > 5 else "")
    return finding(
        "processes-left-running",
        f"{len(left)} processes of {whose} still ran after it exited; dflashdoctor stopped what it may",
        detail=f"Still running once {whose} had exited: {named}. Each this user may signal was sent "
        "SIGTERM, then SIGKILL; another user's process is only named, unless this is root.",
        evidence={"left_running": left[:50]},
        fix="Have the program wait for (join) what it starts, or stop its background workers and daemons "
        "before it exits.",
    )
