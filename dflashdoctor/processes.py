"""Whether a process still runs (one that left a temporary file in a cache, and so may still be
writing it, or one of a run's processes), and killing a probe with everything it started. Standard
library only: the probe host uses it too."""

from __future__ import annotations

import contextlib
import os
import signal


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


def kill_with_group(pid: int) -> None:
    """SIGKILL to a probe and its process group. The probe first: one just forked by the probe host
    may not have made its own group yet (it calls setsid as it starts), and then has no children
    either; a probe already gone is no error."""
    for kill in (os.kill, os.killpg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
