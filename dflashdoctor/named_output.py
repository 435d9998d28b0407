"""A copy of the report written where the user named (`--junit PATH`, `--sarif PATH`).

What is at the name decides how it is written, and nothing there that is not a regular file is ever
renamed over:
- `-`, and whatever path leads to one of this process's descriptors in /proc (`/dev/stdout`,
  `/dev/fd/N`, a link to a link to either, `/proc/self/fd/../fd/1`): written to that descriptor, as a
  stream (a CI habit: `--sarif /dev/stdout | upload`), never renamed over the file behind it.
- a character device (`/dev/null`) or a FIFO of this user's with a reader: written in place, as a
  stream (renaming a file over `/dev/null` would leave the machine without one).
- nothing, or a regular file of this user's: made under a random name in the same folder and then
  linked to the name (nothing there) or renamed over it (a file there), so a reader sees the old
  file or the new one and a name taken meanwhile is never replaced.
- anything else (a folder, a socket, a block device, another user's file or FIFO, a link another
  user made): refused, exit 2.
The folders on the way are walked without following another user's links (safe_paths.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from dflashdoctor.placed_files import kind_of
from dflashdoctor.report_folder import can_make_in, makeable_problem
from dflashdoctor.safe_fs import trusted_uids, user_name
from dflashdoctor.safe_paths import Located, PathRefused, in_proc, locate, resolve_links

STDOUT = "-"
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_PARENTS = 0o777  # folders made on the way to a named file: as `mkdir -p` makes them (the umask applies)


class OutputRefused(Exception):
    """A named output that cannot be written: one line saying why."""


@dataclass
class Destination:
    """Where a named output goes: a descriptor of this process (`descriptor`), a stream opened in
    place (`stream`: a device or FIFO), or a regular file in `located` (`file`)."""

    path: str
    kind: str  # "descriptor" | "stream" | "file"
    descriptor: int | None = None
    located: Located | None = None

    @property
    def is_stdout(self) -> bool:
        return self.kind == "descriptor" and self.descriptor == 1

    def close(self) -> None:
        if self.located is not None:
            self.located.close()


def _descriptor_at(located: Located) -> int | None:
    """The descriptor of this process that `located` names: the folder is this process's (or one of
    its threads') `fd` folder on /proc, however the path reached it (`/dev/stdout`, a link to a link
    to it, `/proc/self/fd/../fd/1`), and the name a number."""
    if not located.name.isdigit() or len(located.name) > 9 or not in_proc(located.fd):
        return None
    folder = os.fstat(located.fd)
    for own in (f"/proc/{os.getpid()}/fd", f"/proc/{os.getpid()}/task/{threading.get_native_id()}/fd"):
        with contextlib.suppress(OSError):
            if os.path.samestat(folder, os.stat(own)):
                return int(located.name)
    return None


def writes_stdout(path: Path | str) -> bool:
    """Whether a copy named so would go to this process's stdout."""
    if os.fspath(path) == STDOUT:
        return True
    try:
        found = destination(path)
    except (OutputRefused, OSError):
        return False
    found.close()
    return found.is_stdout


def _writable_descriptor(path: str, number: int) -> Destination:
    try:
        mode = fcntl.fcntl(number, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        raise OutputRefused(f"{path}: descriptor {number} is not open in this process") from None
    if mode not in (os.O_WRONLY, os.O_RDWR):
        raise OutputRefused(f"{path}: descriptor {number} is not open for writing")
    return Destination(path, "descriptor", descriptor=number)


def _at_name(path: str, located: Located, info: os.stat_result) -> Destination:
    """What an existing name (no link) is, as a destination."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        if info.st_uid not in trusted_uids():
            raise OutputRefused(f"{path} belongs to {user_name(info.st_uid)}: not replaced")
        return Destination(path, "file", located=located)
    if stat.S_ISCHR(mode) or (stat.S_ISFIFO(mode) and info.st_uid in trusted_uids()):
        return Destination(path, "stream", located=located)
    owner = f" of {user_name(info.st_uid)}" if stat.S_ISFIFO(mode) else ""
    raise OutputRefused(f"{path} is {kind_of(mode)}{owner}, not a file to write the report to")


def destination(path: Path | str, *, create: bool = False) -> Destination:
    """Where `path` leads, checked; OutputRefused with one line for what cannot be written there.
    FileNotFoundError when a folder on the way is missing and `create` is false."""
    text = os.fspath(path)
    if text == STDOUT:
        return _writable_descriptor("-", 1)
    try:
        located = resolve_links(locate(text, create=_PARENTS if create else None))
    except (PathRefused, ValueError) as exc:
        raise OutputRefused(str(exc)) from None
    number = _descriptor_at(located)
    if number is not None:
        located.close()
        return _writable_descriptor(text, number)
    try:
        try:
            info = os.stat(located.name, dir_fd=located.fd, follow_symlinks=False)
        except FileNotFoundError:
            return Destination(text, "file", located=located)
        return _at_name(text, located, info)
    except BaseException:
        located.close()
        raise


def problem(path: Path | str) -> str | None:
    """Why a report copy could not be written at `path`, said before any probe runs (nothing made)."""
    try:
        found = destination(path)
    except OutputRefused as exc:
        return str(exc)
    except FileNotFoundError:
        return makeable_problem(Path(path).parent)
    except OSError as exc:
        return f"cannot write {os.fspath(path)}: {exc.strerror or exc}"
    try:
        located = found.located
        if found.kind != "file" or located is None:
            return None
        if not can_make_in(located.fd):  # root's permission bits say yes on /sys or a read-only mount
            return f"{located.shown} cannot be written by this user"
        if _exists(located) and not os.access(located.name, os.W_OK, dir_fd=located.fd):
            return f"{os.fspath(path)} cannot be written by this user"
        return None
    finally:
        found.close()


def _exists(located: Located) -> bool:
    try:
        os.stat(located.name, dir_fd=located.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def write(path: Path | str, text: str) -> None:
    """The report copy written at `path` by the rules above (OutputRefused, or OSError)."""
    data = text.encode("utf-8")
    for _ in range(3):  # a name taken while the file was made: look again at what is there now
        found = destination(path, create=True)
        try:
            if found.kind == "descriptor":
                return _to_descriptor(found.descriptor or 1, data)
            if found.kind == "stream":
                return _to_stream(found, data)
            if _to_file(found, data):
                return
        finally:
            found.close()
    raise OutputRefused(f"{os.fspath(path)} kept changing while the report was written: not written")


def _to_descriptor(number: int, data: bytes) -> None:
    for stream in (sys.stdout, sys.stderr):  # what this process printed there comes first
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _write_all(number, data)


def _to_stream(found: Destination, data: bytes) -> None:
    assert found.located is not None
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(found.located.name, flags, dir_fd=found.located.fd)
    except OSError as exc:
        fifo = stat.S_ISFIFO(os.stat(found.located.name, dir_fd=found.located.fd, follow_symlinks=False).st_mode)
        if exc.errno == errno.ENXIO and fifo:
            raise OutputRefused(f"{found.path} is a FIFO nobody reads: not written") from None
        raise OutputRefused(f"cannot open {found.path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
            raise OutputRefused(f"{found.path} changed while it was opened: not written")
        os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _to_file(found: Destination, data: bytes) -> bool:
    """Made under a random name, then linked to the name (which must still be free) or renamed over
    the regular file of this user's that is there. False when the name changed meanwhile."""
    assert found.located is not None
    folder, name = found.located.fd, found.located.name
    temporary = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, _NEW_FILE, 0o644, dir_fd=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        try:
            now = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            try:
                os.link(temporary, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
            except FileExistsError:
                return False
            return True
        if not stat.S_ISREG(now.st_mode) or now.st_uid not in trusted_uids():
            return False
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=folder)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
