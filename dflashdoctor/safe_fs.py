"""Walking below a folder that was opened once, without ever following a symbolic link.

`cache fix` and `cache restore` move entries on behalf of whoever runs them, often root, and the
paths they move come from a scan or from a manifest on disk. A link planted anywhere on such a path
would turn it into a path outside the cache. So every move starts at an open folder (the cache root,
a quarantine folder) and walks down one checked name at a time with O_NOFOLLOW: a link, a loop or a
file where a folder should be ends the walk with an OSError instead of leaving the tree. Renames and
reads then go through those open folders, so nothing can be swapped between the check and the use.
Report folders and the run agent's event files open their files through here too, so both sides
import it: standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import os
import pwd
import stat
from collections.abc import Iterator, Sequence

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE_FOLDER = 0o700


class Untrusted(Exception):
    """A quarantine folder or file that may not be believed: `path` and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def is_plain_name(name: object) -> bool:
    """One path component that stays where it is: not empty, not `.` or `..`, no separator or NUL."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def trusted_uids() -> frozenset[int]:
    """Whose files and links are this user's own: this user and root, and as root under sudo the
    user who ran it (as git's safe.directory check has it; the environment is the caller's)."""
    me = os.geteuid()
    uids = {me, 0}
    sudo = os.environ.get("SUDO_UID", "")
    if me == 0 and sudo.isascii() and sudo.isdigit() and len(sudo) < 11:
        uids.add(int(sudo))
    return frozenset(uids)


@functools.lru_cache(maxsize=64)
def _private_group(gid: int, owner: int) -> bool:
    """A user private group: named as its owner, no one else in it or having it as their own."""
    try:
        group = grp.getgrgid(gid)
        name = pwd.getpwuid(owner).pw_name
    except (KeyError, OverflowError):
        return False
    if group.gr_name != name or any(member != name for member in group.gr_mem):
        return False
    return all(user.pw_name == name for user in pwd.getpwall() if user.pw_gid == gid)


def others_can_write(info: os.stat_result) -> str | None:
    """Who besides its owner can write it, in words; None when no one. Its group counts unless it is
    the owner's private group, as ssh and git judge a file's group."""
    mode = info.st_mode
    if mode & 0o002:
        return "everyone"
    if mode & 0o020 and not _private_group(info.st_gid, info.st_uid):
        try:
            return f"the group {grp.getgrgid(info.st_gid).gr_name}"
        except KeyError:
            return f"the group {info.st_gid}"
    return None


def untrusted_reason(info: os.stat_result) -> str | None:
    """Why a quarantine folder or manifest may not be believed, judged as ssh judges a key file: it
    must belong to the user who runs this (or to root) and be writable by nobody else."""
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        return f"owned by {user_name(info.st_uid)}, not by {user_name(me)}, who runs this"
    loose = info.st_mode & 0o022
    if loose:
        who = "its group and others" if loose == 0o022 else "others" if loose == 0o002 else "its group"
        return f"writable by {who} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def refused_because(exc: OSError) -> str:
    """An OSError from a walk, in the words of what was found there."""
    if exc.errno == errno.ELOOP:
        return "a symbolic link (never followed)"
    if exc.errno == errno.ENOTDIR:
        return "not a folder"
    return exc.strerror or type(exc).__name__


def planted_link(parent_fd: int, name: str) -> str | None:
    """Why the link `name` may not be followed, by the rule Linux applies with protected_symlinks: in a
    world-writable sticky folder (the temp folder, where the default Inductor root lives), a link made
    by another user than the follower or the folder's owner could lead anywhere (/etc, ~/.ssh)."""
    try:
        link = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return None
    folder = os.fstat(parent_fd)
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & 0o002
    if stat.S_ISLNK(link.st_mode) and shared and link.st_uid not in (os.geteuid(), folder.st_uid):
        return f"a link made by {user_name(link.st_uid)} in a world-writable folder: it may lead anywhere"
    return None


def open_named_folder(path: str | os.PathLike[str]) -> int:
    """A folder the user named or the environment set: links on its way are the user's own setup."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_child_folder(dir_fd: int, name: str) -> int:
    """The folder `name` in `dir_fd`, never through a link (ELOOP for one: Linux says ENOTDIR)."""
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=dir_fd)
    except NotADirectoryError:
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


@contextlib.contextmanager
def closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def descend(base_fd: int, parts: Sequence[str], *, create: int | None = None, private: bool = False) -> int:
    """The folder at `parts` below `base_fd`, opened without following links; the caller closes it.

    `create` is the mode for folders that are missing (without it a missing one raises
    FileNotFoundError); with `private` each folder must pass `untrusted_reason` (Untrusted otherwise).
    """
    fd = os.dup(base_fd)
    try:
        for part in parts:
            if not is_plain_name(part):
                raise Untrusted(part, "not a plain file name")
            try:
                child = open_child_folder(fd, part)
            except FileNotFoundError:
                if create is None:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, create, dir_fd=fd)
                child = open_child_folder(fd, part)
            os.close(fd)
            fd = child
            reason = untrusted_reason(os.fstat(fd)) if private else None
            if reason:
                raise Untrusted(part, reason)
        return fd
    except BaseException:
        os.close(fd)
        raise


def exists_in(dir_fd: int, name: str) -> bool:
    """Whether `name` is there (a dangling link counts): never follows it."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def read_private_file(dir_fd: int, name: str, limit: int = 1 << 30) -> bytes:
    """A file of ours (a manifest, a marker): not a link, a regular file, owned and not loose."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with closing(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Untrusted(name, "not a regular file")
        reason = untrusted_reason(info)
        if reason:
            raise Untrusted(name, reason)
        if info.st_size > limit:
            raise Untrusted(name, f"{info.st_size} bytes, more than any manifest dflashdoctor writes")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)


def write_private_file(dir_fd: int, name: str, data: bytes) -> None:
    """Atomically and durably: a temporary file of our own, fsynced, renamed over `name`, then the
    folder fsynced, so a kill at any point leaves the old file or the new one, whole."""
    temporary = f".{name}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600, dir_fd=dir_fd)
    with closing(fd):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)
