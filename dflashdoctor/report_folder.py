"""Report folders and files written where another local user may have been first.

dflashdoctor runs as root on shared nodes and writes into team folders (`run --report-dir SHARED`,
`merge`, the default `./reports` of a shared working folder). A name written by path can be a
link another user planted (`report.json -> /root/.ssh/authorized_keys`), and a temporary name
that can be guessed (`.report.json.<pid>.tmp`) can be planted for the next pids. So a report
folder is opened once, without following a link, and refused when another user owns it or can
replace what is in it (writable by others, without the sticky bit); every file is then made under
a random name with O_CREAT|O_EXCL|O_NOFOLLOW through that open folder and renamed over its final
name there, which replaces a planted link instead of following it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from dflashdoctor.errors import BadInput
from dflashdoctor.safe_fs import PRIVATE_FOLDER, open_child_folder, others_can_write, trusted_uids, user_name
from dflashdoctor.safe_paths import open_folder

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def unsafe_reason(info: os.stat_result) -> str | None:
    """Why a folder may not be written into: owned by another user, or open to others' renames."""
    if info.st_uid not in trusted_uids():
        return f"owned by {user_name(info.st_uid)}, not by {user_name(os.geteuid())}, who runs this"
    writers = others_can_write(info)
    if writers and not info.st_mode & stat.S_ISVTX:
        return (
            f"writable by {writers} (mode {stat.S_IMODE(info.st_mode):o}) without the sticky bit: they could "
            "replace what is written there (chmod go-w, or chmod +t for a shared folder)"
        )
    return None


class ReportFolder:
    """An open report folder: files go in through its descriptor, never by path."""

    def __init__(self, fd: int, path: Path, created: bool = False) -> None:
        self.fd = fd
        self.path = path
        self.created = created  # made by this open

    @classmethod
    def open(cls, path: Path, *, create: bool = True) -> ReportFolder:
        """The folder at `path`: its parents made as named (a link on the way is followed only when
        this user or root made it: safe_paths.py), the folder itself made private when missing, else
        opened without following a link; BadInput when it is a link, not a folder, or not safe to
        write into."""
        parent, name = path.parent, path.name
        if not name or name in (".", ".."):
            path = path.resolve()
            parent, name = path.parent, path.name
        try:
            parent_fd = open_folder(parent, create=0o777 if create else None)
        except OSError as exc:
            raise BadInput(f"cannot open the report folder {path}: {exc.strerror or exc}") from None
        created = False
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, PRIVATE_FOLDER, dir_fd=parent_fd)
                    created = True
            fd = open_child_folder(parent_fd, name)
        except OSError as exc:
            why = "it is a symbolic link (never followed)" if exc.errno == errno.ELOOP else exc.strerror
            raise BadInput(f"refusing the report folder {path}: {why}") from None
        finally:
            os.close(parent_fd)
        reason = unsafe_reason(os.fstat(fd))
        if reason:
            os.close(fd)
            raise BadInput(f"refusing the report folder {path}: {reason}")
        return cls(fd, path, created)

    def __enter__(self) -> ReportFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def write(self, name: str, text: str, *, private: bool = False) -> None:
        """`name` replaced whole: a reader in another process sees the old file or the new one.
        `private` files (environment values, events) are 0600, the others 0644."""
        write_in(self.fd, name, text.encode("utf-8"), 0o600 if private else 0o644)


@contextlib.contextmanager
def held(path: Path | None) -> Iterator[None]:
    """The report folder the user named, this command's alone while it runs: a second dflashdoctor
    given the same --report-dir while the first still runs would write its report over the first's,
    file by file, so it is refused (exit 2) before it probes anything, as `run` refuses a second run
    in one folder. The lock is the kernel's (flock on the open folder), gone with the process,
    however it ends. A folder made here and left empty (the command stopped before its report) is
    removed again."""
    if path is None:
        yield
        return
    folder = ReportFolder.open(path)
    try:
        fcntl.flock(folder.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        folder.close()
        raise BadInput(
            f"{path} is the report folder of another dflashdoctor still running: give another --report-dir"
        ) from None
    try:
        yield
    finally:
        if folder.created and not os.listdir(folder.fd):
            with contextlib.suppress(OSError):
                _remove_made(folder)
        folder.close()


def _remove_made(folder: ReportFolder) -> None:
    """The empty folder made for this command, removed again: through its parent reached as before
    (no other user's link followed), and only if the name there is still that very folder (a path
    swapped meanwhile, through a folder another user owns, must not take one of root's with it)."""
    parent = open_folder(folder.path.parent)
    try:
        there = os.stat(folder.path.name, dir_fd=parent, follow_symlinks=False)
        if os.path.samestat(there, os.fstat(folder.fd)):
            os.rmdir(folder.path.name, dir_fd=parent)
    finally:
        os.close(parent)


def can_make_in(folder_fd: int) -> bool:
    """Whether a file can be made in the open folder, found by making one (a random name, O_EXCL,
    removed at once): permission bits say yes for root on /proc or /sys, where nothing can be made,
    and on a read-only mount."""
    name = f".dflashdoctor-can-write.{secrets.token_hex(8)}"
    try:
        os.close(
            os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder_fd)
        )
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder_fd)
    return True


def makeable_problem(path: Path) -> str | None:
    """Why `path` (a folder, made with its missing parents if need be) could not be made or written:
    the nearest part of it that exists must be a folder, reached without another user's link, in
    which something can be made. Said before any probe runs."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        fd = open_folder(existing)
    except OSError as exc:
        return f"cannot reach {path}: {exc.strerror or exc}"
    try:
        return None if can_make_in(fd) else f"{existing} cannot be written by this user"
    finally:
        os.close(fd)


def write_in(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Made under a random name that cannot be planted in advance, then renamed over `name`."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, _NEW_FILE, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def open_append(path: str) -> int:
    """A log file of this process (named by its pid): made with O_EXCL|O_NOFOLLOW; one already there
    is reused only when it is a plain file of this user's with no other name (a process that
    exec'd itself keeps its pid), never a link or another user's file. OSError otherwise."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(path, flags | os.O_NONBLOCK)  # a planted FIFO must not block the open
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, f"{path} is not this process's own log file")
    os.set_blocking(fd, True)
    return fd
