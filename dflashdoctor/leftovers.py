"""What a finished child of the doctor left running, found and stopped: a `run` command's daemons,
a probe's workers, a target's `setsid` grandchild.

Found by what the kernel records, which no process can fake for itself (a `Lineage`): the child's
process group and session (neither can be joined from outside: setsid makes a new one, setpgid moves
within its session only, and a pid in use as either is never given to another process), the process
tree below the child's launcher, a subreaper (`run`: runs/launcher.py, so a daemon's orphans stay
below it), and the cgroup where it is the run's own (cgroup.py). Such a process is the child's
descendant whatever user it runs as: named, and stopped where the doctor may (root may).

Also by a marker: every child the doctor starts carries one in its environment (`NAME=value`,
unique to it), which every program it execs inherits. That finds a daemon of a probe whose group and
session it left (a probe has no launcher). Only this user's processes count there: another local
user who copies a marker into a process of theirs gains nothing (the doctor would stop nothing of
theirs, and their process never reads as ours). A descendant that forked without exec from a
process whose marker was set after it started (a probe forked from the gate's probe host) keeps that
process's original environment, and is found only while it stays in the group or the session.

Linux only (`/proc`); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from dflashdoctor import cgroup
from dflashdoctor.processes import Entry, descendants, process_table, stat_fields
from dflashdoctor.records import LeftRunningRecord
from dflashdoctor.redaction import redact_argv

_POLL_S = 0.1  # a scan of every process's environment
_GRACE_POLL_S = 0.02  # a read of the signalled processes' own states
_SETTLE_S = 2.0  # what the child started gets this long to end on its own
_GRACE_S = 10.0  # between SIGTERM and SIGKILL
_COMPILE_WORKER = "torch/_inductor/compile_worker/__main__.py"


@dataclass(frozen=True)
class Lineage:
    """What marks a child's descendants. A group or session of 0 or 1 (the kernel's, init's: a pid
    not yet known) is no child's, and a `root` of 0 none."""

    marker: str  # "NAME=value", in the environment the child started with
    group: int  # its own process group
    session: int = 0  # the session it (or its launcher) made
    root: int = 0  # its launcher, a child subreaper: every descendant stays below it
    cgroup: Path | None = None  # the run's own cgroup (cgroup.private_to)


def _proven(lineage: Lineage, table: dict[int, Entry]) -> set[int]:
    """The live processes the kernel records as the child's descendants, of any user."""
    # A group or session id names the child's only while no other process holds its number: the
    # kernel hands out a pid again only once no process is in a group or session of that number, so
    # a running process with that pid (not the launcher, the doctor's own; a zombie is the child
    # itself, whose number cannot be taken before it is reaped) is a new one
    # that took the freed number, and what is in its group or session is its own. With pid_max at
    # 32768 this happened within the settle time of a probe that had just ended: a probe started at
    # once by another gate got the number, and was killed as the first one's leftover.
    ids = {lineage.group, lineage.session} - {0, 1}
    ids = {number for number in ids if number not in table or not table[number].running or number == lineage.root}
    found = {entry.pid for entry in table.values() if entry.running and (entry.group in ids or entry.session in ids)}
    below = descendants(lineage.root, table) if lineage.root > 1 else set()
    found |= below
    if lineage.cgroup is not None:  # less what this doctor started beside the launcher
        beside = descendants(os.getpid(), table) - below
        found |= {pid for pid in cgroup.members(lineage.cgroup) if pid in table and table[pid].running} - beside
    return found


def _marked(marker: bytes, table: dict[int, Entry]) -> set[int]:
    """This user's live processes whose environment, as it was when they started, holds `marker`."""
    uid = os.geteuid()
    found = set()
    for pid, entry in table.items():
        try:
            if not entry.running or os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read(1 << 20)
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.add(pid)
    return found


def running(pid: int) -> bool:
    """It exists and has not exited. A zombie has: it holds nothing but its pid until its parent
    reaps it, and the parent of an orphan is init, which in a container may reap late (1.6 s on a
    Firecracker VM of this workplace, whose init reaps in rounds) or never (a shell as PID 1)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


def _words(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read(4096).decode(errors="replace").split("\0")
    except OSError:
        return []
    return [word for word in words if word]


def command_of(pid: int) -> str:
    """Its command line, with what looks secret taken out (`--hf-token X`), as a report says it."""
    words = _words(pid)
    return " ".join(redact_argv(words)) if words else "?"


def follows_its_parent(pid: int) -> bool:
    """Inductor's compile-worker pool (`torch/_inductor/compile_worker/__main__.py --parent=PID`, and
    the workers it forks, which keep its command line): torch's own helper, which ends itself once
    the process that compiled is gone, though not at once (2 s on the 2-core CPU after a bare
    os._exit, more on a 16-core H200 node, where it has 16 workers to wind down). A probe ends with
    os._exit to skip teardown, so a warm gate's probe that compiled left one every time: it is
    stopped with the rest, never named as the program's."""
    words = _words(pid)
    return any(word.replace("\\", "/").endswith(_COMPILE_WORKER) for word in words[:3]) or (
        "torch._inductor.compile_worker" in words[1:3]
    )


def still_running(lineage: Lineage) -> set[int]:
    """The child's descendants still running, by what the kernel records and by the marker, this
    doctor and the launcher excepted."""
    table = process_table()
    left = _proven(lineage, table) | _marked(lineage.marker.encode(), table)
    return left - {os.getpid(), lineage.root}


def stop_leftovers(lineage: Lineage, settle_s: float = _SETTLE_S) -> list[LeftRunningRecord]:
    """What of an exited child still runs: given `settle_s` to end on its own, then named and
    stopped (SIGTERM, SIGKILL after a grace period). One the doctor may not signal (another user's,
    the doctor not root) is named and not waited for."""
    deadline = time.monotonic() + settle_s
    while (left := still_running(lineage)) and time.monotonic() < deadline:
        if all(follows_its_parent(pid) for pid in left):
            break  # only torch's compile workers, which are going anyway: stopped now, unnamed
        time.sleep(_POLL_S)
    named: list[LeftRunningRecord] = [
        {"pid": pid, "command": command_of(pid)} for pid in sorted(left) if not follows_its_parent(pid)
    ]
    # Each one's start time, read now: over the grace period one may exit and its number go to a
    # new process (a probe the next command starts), which must never get the SIGKILL.
    born = {pid: _started(pid) for pid in left}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(left):
            if _started(pid) != born[pid]:
                left.discard(pid)  # gone, its number perhaps another's already
                continue
            try:
                os.kill(pid, sig)
            except PermissionError:
                left.discard(pid)
            except OSError:
                continue
        end = time.monotonic() + _GRACE_S
        while time.monotonic() < end and any(running(pid) for pid in left):
            time.sleep(_GRACE_POLL_S)
        left = {pid for pid in left if running(pid) and _started(pid) == born[pid]}
        if not left:
            break
    return named


def _started(pid: int) -> bytes | None:
    """When the process now holding `pid` started (clock ticks after boot, /proc/PID/stat field 22):
    two processes that held one number one after the other differ here."""
    fields = stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None
