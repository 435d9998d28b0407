"""What a cache entry holds, file by file, read through open folders without following links.

A manifest keeps this for every entry a fix moves (relative path, size and sha256 of each regular
file, the target of each link), and a restore compares the entry it put back with it. Anything that
is neither a regular file nor a link (a FIFO, a socket) is left out: opening a FIFO could block the
command forever, and triton and torch write neither.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any

from dflashdoctor.safe_fs import closing

FileRecord = dict[str, Any]


def _digest(dir_fd: int, name: str) -> tuple[int, str] | None:
    """(size, sha256) of a regular file; None for anything else."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with closing(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        digest = hashlib.sha256()
        while block := os.read(fd, 1 << 20):
            digest.update(block)
        return info.st_size, digest.hexdigest()


def _record(dir_fd: int, name: str, relative: str) -> FileRecord | None:
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        return {"path": relative, "link": os.readlink(name, dir_fd=dir_fd)}
    digest = _digest(dir_fd, name) if stat.S_ISREG(info.st_mode) else None
    return None if digest is None else {"path": relative, "size": digest[0], "sha256": digest[1]}


def inventory(parent_fd: int, name: str) -> list[FileRecord]:
    """Every file of the entry `name` in the folder `parent_fd` (itself when it is a file), sorted by
    path; OSError when something cannot be read."""
    info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        record = _record(parent_fd, name, ".")
        return [record] if record else []
    records = []
    for folder, dirs, files, folder_fd in os.fwalk(name, dir_fd=parent_fd, follow_symlinks=False, onerror=_raise):
        below = os.path.relpath(folder, name)
        # fwalk lists a link to a folder among the folders (and does not enter it): _record keeps it
        for file_name in [*files, *dirs]:
            record = _record(folder_fd, file_name, file_name if below == "." else os.path.join(below, file_name))
            if record:
                records.append(record)
    return sorted(records, key=lambda r: r["path"])


def _raise(exc: OSError) -> None:
    raise exc
