"""One fix or restore of a root at a time: an advisory lock inside the root's quarantine folder.

Two fixes of one root that overlap would each scan the same broken entries and move them into two
quarantines, the loser reporting errors for entries the winner already moved. The lock file sits in
the quarantine folder itself, which is private to its owner: another user can neither create it
first nor hold it. `flock` is released by the kernel when its holder dies, kill -9 included, so a
crashed run never leaves the root locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from dflashdoctor.errors import BadInput
from dflashdoctor.safe_fs import Untrusted, closing, untrusted_reason

LOCK = "lock"
_POLL_S = 0.05
_SAY_WAITING_AFTER_S = 1.0


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it down."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {int(record['pid'])}, {record['command']!r} since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def root_lock(home_fd: int, home: str, wait_s: float) -> Iterator[None]:
    """Holds the lock of the quarantine folder `home_fd` (named `home`), waiting up to `wait_s`."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=home_fd)
    with closing(fd):
        reason = untrusted_reason(os.fstat(fd))
        if reason:
            raise Untrusted(os.path.join(home, LOCK), reason)
        started = time.monotonic()
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= wait_s:
                    raise BadInput(
                        f"{home} is locked by {_holder(fd)}, another fix or restore of that cache; "
                        f"waited {wait_s:g} s (--wait)"
                    ) from None
                if not told and waited >= _SAY_WAITING_AFTER_S:  # a short wait passes in silence
                    print(f"dflashdoctor: waiting for {_holder(fd)} to finish with {home}", file=sys.stderr)
                    told = True
                time.sleep(_POLL_S)
        record = {"pid": os.getpid(), "command": " ".join(sys.argv), "since": datetime.now(UTC).isoformat()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode("ascii"), 0)  # ensure_ascii: any argv is ASCII here
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
