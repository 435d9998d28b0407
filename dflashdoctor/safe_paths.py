"""Paths walked one name at a time, so that nothing another local user placed on the way is followed.

`open(path)` follows every link in `path`. dflashdoctor, often root, writes reports where the user
says (`--report-dir`, `--sarif`, `--junit`) and runs code the gate's configuration names: a link
another user planted on the way (`/shared/team/ci -> /root/.ssh`) would carry either somewhere the
user never meant. Here each name is looked at before it is used: a folder is opened without
following a link, a link is followed only when this user or root made it (or, under sudo, the user
who ran sudo), and a caller may refuse any folder it passes through (the gate refuses one another
user could change). Standard library only: both sides use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from dflashdoctor.safe_fs import trusted_uids, user_name

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup
_MAX_NAMES = 256  # names walked in one path, links' included: no report or source path nests deeper

# A folder on the way, shown as a path, and what fstat says of it: a reason to stop there (a
# predicate of the folder: "belongs to ..."), or None.
FolderCheck = Callable[[str, os.stat_result], str | None]


class PathRefused(OSError):
    """A path refused for what was found on it (`reason`), not for an error of the filesystem."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EPERM, f"{path} {reason}")
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path} {self.reason}"


@dataclass
class Located:
    """The folder that holds a path's last name, open (`fd`, closed by the caller), and that name;
    `shown` is the folder as a path, for messages."""

    fd: int
    name: str
    shown: str

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _names(path: str) -> list[str]:
    """The names of `path` in the order they are walked, as a stack (the first name last)."""
    return [name for name in reversed(path.split("/")) if name not in ("", ".")]


def _join(shown: str, name: str) -> str:
    return f"{shown.rstrip('/')}/{name}" if shown != "." else name


class _Walk:
    """One walk down a path from `/` or the current folder: `fd` is where it stands."""

    def __init__(self, path: str, check: FolderCheck | None, start: Located | None = None) -> None:
        self.check = check
        if path.startswith("/"):
            self.fd, self.shown = os.open("/", _FOLDER & ~os.O_NOFOLLOW), "/"
        elif start is not None:
            self.fd, self.shown = os.dup(start.fd), start.shown
        else:
            self.fd, self.shown = os.open(".", _FOLDER & ~os.O_NOFOLLOW), "."
        self.links = 0
        self.uids = trusted_uids()
        self._checked()

    def _checked(self) -> None:
        if self.check is None:
            return
        reason = self.check(self.shown, os.fstat(self.fd))
        if reason:
            raise PathRefused(self.shown, reason)

    def restart_at_root(self) -> None:
        os.close(self.fd)
        self.fd = os.open("/", _FOLDER & ~os.O_NOFOLLOW)
        self.shown = "/"
        self._checked()

    def follow(self, name: str, pending: list[str]) -> None:
        """The link `name` here: its target's names put where the walk goes next, if its maker may
        lead this user somewhere."""
        info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        if info.st_uid not in self.uids:
            raise PathRefused(_join(self.shown, name), f"is a link made by {user_name(info.st_uid)}, never followed")
        self.links += 1
        if self.links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), _join(self.shown, name))
        target = os.readlink(name, dir_fd=self.fd)
        pending.extend(_names(target))
        if target.startswith("/"):
            self.restart_at_root()

    def enter(self, name: str, create: int | None) -> bool:
        """Into the folder `name`: True once there, False when it is a link to follow first."""
        try:
            child = os.open(name, _FOLDER, dir_fd=self.fd)
        except FileNotFoundError:
            if create is None:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, create, dir_fd=self.fd)
            child = os.open(name, _FOLDER, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if not stat.S_ISLNK(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode):
                raise OSError(errno.ENOTDIR, "not a folder", _join(self.shown, name)) from None
            return False
        os.close(self.fd)
        self.fd = child
        self.shown = _join(self.shown, name)
        self._checked()
        return True

    def down(self, pending: list[str], create: int | None) -> None:
        walked = 0
        while pending:
            walked += 1
            if walked > _MAX_NAMES:  # before thousands of folders are made, one in the other
                raise OSError(errno.ENAMETOOLONG, f"it nests too deep (more than {_MAX_NAMES} folders)")
            name = pending.pop()
            if not self.enter(name, create):
                self.follow(name, pending)


def open_folder(path: str | os.PathLike[str], *, create: int | None = None, check: FolderCheck | None = None) -> int:
    """The folder at `path`, open (the caller closes it). Every folder on the way is opened without
    following a link; a link is followed only when made by a trusted user (trusted_uids), else
    PathRefused; `check` may refuse any folder passed. With `create`, missing folders are made
    with that mode. OSError (FileNotFoundError, NotADirectoryError, ELOOP) as the filesystem says."""
    walk = _Walk(os.fspath(path), check)
    try:
        walk.down(_names(os.fspath(path)), create)
        return walk.fd
    except BaseException:
        os.close(walk.fd)
        raise


def locate(
    path: str | os.PathLike[str],
    *,
    create: int | None = None,
    check: FolderCheck | None = None,
    start: Located | None = None,
) -> Located:
    """The folder holding `path`'s last name, reached as `open_folder` reaches a folder (a relative
    path from `start`'s folder, else the current one), and that name, not looked at: the caller
    decides what a link or a device there means. `path` must end in a name (not `/`, `.` or `..`):
    ValueError otherwise."""
    text = os.fspath(path).rstrip("/")
    head, slash, name = text.rpartition("/")
    if name in ("", ".", ".."):
        raise ValueError(f"{os.fspath(path)} does not end in a file name")
    folder = head if head else "/" if slash else ""
    walk = _Walk(folder, check, start)
    try:
        walk.down(_names(folder), create)
    except BaseException:
        os.close(walk.fd)
        raise
    return Located(walk.fd, name, walk.shown)


def in_proc(folder_fd: int) -> bool:
    """Whether the open folder is on /proc, whose links say where a descriptor leads (`pipe:[7]`, or
    a file's path that is no way to reach that descriptor again) rather than a path to walk."""
    try:
        return os.fstat(folder_fd).st_dev == os.stat("/proc").st_dev
    except OSError:
        return False


def resolve_links(located: Located, check: FolderCheck | None = None) -> Located:
    """`located` with a link at its name followed (a trusted user's only, as on the way), until the
    name is no link: the place a write or a read of that name would reach. Takes over `located`'s
    folder descriptor."""
    for _ in range(_MAX_LINKS):
        try:
            info = os.stat(located.name, dir_fd=located.fd, follow_symlinks=False)
        except FileNotFoundError:
            return located
        if not stat.S_ISLNK(info.st_mode) or in_proc(located.fd):
            return located  # /proc's links (a descriptor, a cwd) are the kernel's, not text to follow
        shown = _join(located.shown, located.name)
        if info.st_uid not in trusted_uids():
            located.close()
            raise PathRefused(shown, f"is a link made by {user_name(info.st_uid)}, never followed")
        target = os.readlink(located.name, dir_fd=located.fd)
        try:
            followed = locate(target, check=check, start=located)
        finally:
            located.close()
        located = followed
    located.close()
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), located.name)
