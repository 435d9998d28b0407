"""One fix or restore of a root at a time: an advisory lock inside the root's quarantine folder;
and whether torch's own lock on an entry is held (a compile writing it).

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
import stat
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


def held_by_a_writer(lock_path: str, owner_uid: int) -> bool:
    """Whether a process holds the flock on `lock_path` now: torch's FileLock holds
    `locks/<key>.lock` while its compiler writes `<key>.*.so` in place, so an empty or half-written
    file under a held lock is a compile in progress, not damage. Opened without following links or
    blocking (a FIFO planted there never stalls the scan); a lock file of another owner than the
    entry's does not count (nobody else hides an entry by holding a lock of their own). The shared lock
    is dropped at once: a compile that asks for it in that microsecond waits one filelock poll."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with closing(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner_uid:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a filesystem without flock: nothing to tell
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
