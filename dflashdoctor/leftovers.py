"""What a finished child of the doctor left running, found and stopped: a `run` command's daemons,
a probe's workers, a target's `setsid` grandchild.

A process group alone misses every descendant that made its own session (setsid, a daemon) or was
started by one that did. So every child the doctor starts carries a marker in its environment
(`NAME=value`, unique to that child), which every program it execs inherits; once the child has
exited, the processes whose environment holds the marker are its descendants, wherever they went.
Only this user's processes count: another local user who copies a marker into a process of theirs
gains nothing (the doctor would stop nothing of theirs, and their process never reads as ours).

Linux only (`/proc`); elsewhere nothing is found. A descendant that forked without exec from a
process whose marker was set after it started (a probe forked from the gate's probe host) keeps
that process's original environment and is found only while it stays in the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from dflashdoctor.records import LeftRunningRecord
from dflashdoctor.redaction import redact_argv

_POLL_S = 0.1  # a scan of every process's environment
_GRACE_POLL_S = 0.02  # a read of the signalled processes' own states
_SETTLE_S = 2.0  # what the child started gets this long to end on its own
_GRACE_S = 10.0  # between SIGTERM and SIGKILL
_COMPILE_WORKER = "torch/_inductor/compile_worker/__main__.py"


def _proc_entries() -> list[int]:
    if not os.path.isdir("/proc"):
        return []
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _group_members(group: int) -> set[int]:
    """The live members of a child's own process group. Group 0 is the kernel's and 1 init's: a
    caller passing either (a pid not yet known) must not have them stopped."""
    if group <= 1:
        return set()
    members = set()
    for pid in _proc_entries():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] != b"Z" and int(fields[2]) == group:
            members.add(pid)
    return members


def _marked(marker: bytes) -> set[int]:
    """This user's live processes whose environment, as it was when they started, holds `marker`."""
    uid = os.geteuid()
    found = set()
    for pid in _proc_entries():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read(1 << 20)
        except OSError:
            continue
        fields = _stat_fields(pid)
        if marker in environ.split(b"\0") and fields is not None and fields[0] != b"Z":
            found.add(pid)
    return found


def running(pid: int) -> bool:
    """It exists and has not exited. A zombie has: it holds nothing but its pid until its parent
    reaps it, and the parent of an orphan is init, which in a container may reap late (1.6 s on a
    Firecracker VM of this workplace, whose init reaps in rounds) or never (a shell as PID 1)."""
    fields = _stat_fields(pid)
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


def still_running(group: int, marker: str) -> set[int]:
    """The members of `group` and the processes carrying `marker`, this doctor excepted."""
    left = _group_members(group) | _marked(marker.encode())
    left.discard(os.getpid())
    return left


def stop_leftovers(group: int, marker: str, settle_s: float = _SETTLE_S) -> list[LeftRunningRecord]:
    """What of an exited child still runs: given `settle_s` to end on its own, then named and
    stopped (SIGTERM, SIGKILL after a grace period)."""
    deadline = time.monotonic() + settle_s
    while (left := still_running(group, marker)) and time.monotonic() < deadline:
        if all(follows_its_parent(pid) for pid in left):
            break  # only torch's compile workers, which are going anyway: stopped now, unnamed
        time.sleep(_POLL_S)
    named: list[LeftRunningRecord] = [
        {"pid": pid, "command": command_of(pid)} for pid in sorted(left) if not follows_its_parent(pid)
    ]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        end = time.monotonic() + _GRACE_S
        while time.monotonic() < end and any(running(pid) for pid in left):
            time.sleep(_GRACE_POLL_S)
        left = {pid for pid in left if running(pid)}
        if not left:
            break
    return named
