"""Whether a process still runs (one that left a temporary file in a cache, and so may still be
writing it, or one of a run's processes), killing a probe with everything it started, and the tail
of what it wrote. Standard library only: the probe host uses it too."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True when `pid` exists on this machine. A cache shared across machines can hold another
    machine's pids: those read as gone, which is what they are to this machine."""
    if pid <= 0 or pid >= 1 << 31:  # a 20-digit "pid" in a crafted file name is no process (os.kill overflows)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def kill_with_group(pid: int) -> None:
    """SIGKILL to a probe and its process group. The probe first: one just forked by the probe host
    may not have made its own group yet (it calls setsid as it starts), and then has no children
    either; a probe already gone is no error."""
    for kill in (os.kill, os.killpg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def output_tail(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` of a child's captured output, read from there: a probe that wrote
    gigabytes to stderr costs the doctor `max_bytes`, not the file (which stays on disk)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_bytes))
            data = handle.read(max_bytes)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")
