"""Reading a file that a user or another process could have placed where dflashdoctor reads.

`merge` reads each node's part from a shared folder, `run` reads the event logs of the command's
processes, the gate its `--config`: any of them may be a link to /dev/zero, a FIFO that never
answers, or hundreds of megabytes. So such a file is opened without blocking (a FIFO would wait for
a writer) and, unless the user named it, without following a link; only a regular file is read,
and never more than a cap. What is refused raises `PlacedFileError`, whose reason names what was
found there.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MIB = 1 << 20


class PlacedFileError(OSError):
    """A file refused for what it is (`reason`), not for an error of the filesystem."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path = str(path)
        self.reason = reason


def kind_of(mode: int) -> str:
    """What a file is, in words: a FIFO or a device is named as such."""
    for test, words in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return words
    return "a file"


def open_placed(
    path: Path | str, *, follow: bool = False, dir_fd: int | None = None, owners: frozenset[int] | None = None
) -> int:
    """A read-only descriptor of the regular file at `path` (in the open folder `dir_fd`, if given);
    PlacedFileError for anything else, or for a file whose owner is not one of `owners`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if not follow and _is_link(path, dir_fd):
            raise PlacedFileError(path, "is a symbolic link (never followed)") from None
        raise exc from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise PlacedFileError(path, f"is {kind_of(info.st_mode)}, not a regular file")
    if owners is not None and info.st_uid not in owners:
        os.close(fd)
        raise PlacedFileError(path, f"belongs to uid {info.st_uid}, not to whoever writes this folder or root")
    os.set_blocking(fd, True)
    return fd


def _is_link(path: Path | str, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def read_placed(
    path: Path | str,
    max_bytes: int,
    *,
    follow: bool = False,
    dir_fd: int | None = None,
    owners: frozenset[int] | None = None,
) -> bytes:
    """The whole regular file at `path`, if it holds at most `max_bytes` (`dir_fd`, `owners`: as
    open_placed takes them)."""
    fd = open_placed(path, follow=follow, dir_fd=dir_fd, owners=owners)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PlacedFileError(path, f"is larger than {max_bytes // MIB} MiB: not a file dflashdoctor wrote")
    return data
