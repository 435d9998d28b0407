"""The parent of `run`'s command, so that nothing the command starts outlives the doctor.

The doctor starts it as `python -I -S launcher.py CONTROL STATUS TEMPORARY... -- COMMAND...` in a
session of its own (-I: the PYTHONPATH that carries the agent to the command is not read here). It
makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a daemon the command starts, however
it detaches (setsid, a double fork, an empty environment, another user), is reparented to this
process and to none further, so the tree below it is the whole run (leftovers.py reads it). It
starts the command in a process group of its own, says on STATUS its pid and later its exit status,
and reaps every orphan that ends.

It watches the doctor through CONTROL, a pipe only the doctor holds open. At the pipe's end (the
doctor done with the run, or gone in any way, SIGKILL included) it ends every process still below it
(SIGTERM, SIGKILL after a grace period), removes the TEMPORARY folders and exits. Not
PR_SET_PDEATHSIG in the command: that fires when the parent *thread* ends (the gate runs work on a
thread pool), reaches the command's first process only, is cleared when the command executes a
set-user-ID program, and removes no folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this dflashdoctor, with no site or PYTHONPATH
from dflashdoctor.processes import descendants, process_table

_PR_SET_CHILD_SUBREAPER = 36
_GRACE_S = 10.0  # between SIGTERM and SIGKILL, as the doctor gives its command
_POLL_S = 0.05
# Python ignores these as it starts; the command gets them at their defaults, as subprocess gives them
_DEFAULTS = (signal.SIGPIPE, signal.SIGXFSZ)


def become_subreaper() -> None:
    """Where the kernel has it (Linux 3.4 on). Elsewhere the tree still holds what has not been
    orphaned, and the session, group and marker find the rest."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _say(status: int, line: str) -> None:
    with contextlib.suppress(OSError):  # the doctor is gone: nobody to tell
        os.write(status, f"{line}\n".encode())


def _reap(command: int, status: int) -> None:
    """Every child that has ended (the command, an orphan given to this subreaper); the command's
    exit status goes to the doctor, as subprocess would give it (negative: killed by that signal)."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == command:
            _say(status, f"exit {os.waitstatus_to_exitcode(code)}")


def _serve(control: int, status: int, command: int, wake: int) -> None:
    """Reaps as children end (SIGCHLD wakes the select) until CONTROL ends; sleeps otherwise."""
    while True:
        ready, _, _ = select.select([control, wake], [], [])
        if wake in ready:
            os.read(wake, 512)
        _reap(command, status)
        if control in ready and not os.read(control, 512):
            return


def _end_tree(command: int, status: int) -> None:
    """SIGTERM to every process below this one, also to those started meanwhile, then SIGKILL to
    what is left after the grace period. One that may not be signalled (a set-user-ID program, the
    doctor not root) is not waited for."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signalled: set[int] = set()
        refused: set[int] = set()
        deadline = time.monotonic() + _GRACE_S
        while True:
            _reap(command, status)
            left = descendants(os.getpid(), process_table()) - refused
            for pid in left - signalled:
                try:
                    os.kill(pid, sig)
                except PermissionError:
                    refused.add(pid)
                except OSError:
                    continue
            signalled |= left
            if not left - refused:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    control, status = int(argv[0]), int(argv[1])
    temporary, command = argv[2:split], argv[split + 1 :]
    for fd in (control, status):
        os.set_inheritable(fd, False)
    become_subreaper()
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    signal.set_wakeup_fd(woken, warn_on_full_buffer=False)  # a full pipe already wakes the select
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    pid = 0
    try:
        pid = os.posix_spawn(command[0], command, os.environ, setpgroup=0, setsigdef=_DEFAULTS)
    except OSError as exc:  # executable but not a program the kernel can start (no shebang, ...)
        _say(status, f"error {exc.errno}")
    else:
        _say(status, f"pid {pid}")
        _serve(control, status, pid, wake)
    _end_tree(pid, status)
    for folder in temporary:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
