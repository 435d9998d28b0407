"""Whether a process still runs: one that left a temporary file in a cache (and so may still be
writing it), or one of a run's processes."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when `pid` exists on this machine. A cache shared across machines can hold another
    machine's pids: those read as gone, which is what they are to this machine."""
    if pid <= 0:
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
