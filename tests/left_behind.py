"""Programs that leave processes behind the way daemons do, and what a test needs to see them go:
their pids read once they have started, a wait with a deadline for each to end, and a cleanup that
kills only a pid still running the command the test started (never a pid reused since)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from dflashdoctor.leftovers import command_of, running

# A shell whose daemon makes its own session and starts with an empty environment: no process group,
# no marker variable of the doctor's; the subshell exits at once, so the daemon is an orphan.
SHELL_DAEMON = "(setsid env -i sleep 311 & echo $! > {pids})"

# A Python program that takes the doctor's variables out of its own environment, then double-forks a
# daemon in a session of its own (the classic daemon), which execs without them.
UNSETS_AND_DOUBLE_FORKS = """
import os, sys, time
for name in [n for n in os.environ if n.startswith("DFLASHDOCTOR")]:
    del os.environ[name]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        os.execvp("sleep", ["sleep", "312"])
    os._exit(0)
os.wait()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""

# A program that leaves a daemon running as the user nobody, in its own session, without the doctor's
# variables: what a root run's trainer does when it drops privileges for a helper.
AS_ANOTHER_USER = (
    "setsid setpriv --reuid=65534 --regid=65534 --clear-groups env -i sleep 313 & echo $! > {pids}.tmp; "
    "mv {pids}.tmp {pids}"
)

# A trainer that starts a daemon (its own session, empty environment), says both pids, then runs on.
TRAINER_WITH_DAEMON = """
import os, subprocess, sys, time
daemon = subprocess.Popen(["setsid", "env", "-i", "sleep", "314"])
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {daemon.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""


def read_pids(path: Path, timeout_s: float = 120.0) -> list[int]:
    """The pids a program wrote (atomically) once it had started what it leaves."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.05)
    return [int(word) for word in path.read_text().split()]


def wait_gone(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    """Waits up to `timeout_s` for every pid to end (a zombie has); the ones still running."""
    deadline = time.monotonic() + timeout_s
    while (left := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_left(pids: list[int], word: str) -> None:
    """A test's cleanup: SIGKILL to each pid still running a command that holds `word` (what the
    test started), so that a failed test leaves nothing behind and kills nothing of another's."""
    for pid in pids:
        if running(pid) and word in command_of(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def dflashdoctor_leftovers(folder: Path) -> list[str]:
    """What the doctor left in a temporary folder of its own (TMPDIR): its folders are named so."""
    return sorted(entry.name for entry in folder.iterdir() if entry.name.startswith("dflashdoctor-"))
