"""A `[tool.dflashdoctor]` table added to a project's pyproject.toml, in a folder opened once, and
never at the cost of the file the project had.

The new file is the old one's text with the table after it, written under a random name in the same
folder (O_EXCL|O_NOFOLLOW), read back as TOML and compared before it replaces anything: everything the
old file said must be there unchanged, and the table must say exactly what init meant, so a string
that escaped its quoting (a file name holding a newline) or an old file the table cannot follow
(`tool = 5`, an inline `tool = {...}`) is refused with the old file untouched. Then it is renamed
over pyproject.toml (or linked to the name, when there was none, so a file made meanwhile is never
replaced). A pyproject.toml that is a link, not a regular file, read-only, or another user's, and a
folder another user owns, are refused: exit 2, one line.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import secrets
import stat
import tomllib
from pathlib import Path
from typing import Any

from dflashdoctor.errors import BadInput
from dflashdoctor.lint.sources import SOURCE_BYTES
from dflashdoctor.placed_files import PlacedFileError, read_placed
from dflashdoctor.safe_fs import trusted_uids, user_name

NAME = "pyproject.toml"


def _existing(folder_fd: int, shown: Path) -> tuple[str, os.stat_result | None]:
    """The old file's text and status, or ("", None) where there is none."""
    try:
        info = os.stat(NAME, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "", None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise BadInput(f"{shown} is not a regular file: not written")
    if info.st_uid not in trusted_uids():
        raise BadInput(f"{shown} belongs to {user_name(info.st_uid)}: not written")
    if not info.st_mode & stat.S_IWUSR:
        raise BadInput(f"{shown} is read-only (mode {stat.S_IMODE(info.st_mode):o}): not written")
    try:
        data = read_placed(NAME, SOURCE_BYTES, dir_fd=folder_fd, owners=trusted_uids())
        return data.decode("utf-8"), info
    except PlacedFileError as exc:
        raise BadInput(f"{shown} {exc.reason}: not written") from None
    except UnicodeDecodeError:
        raise BadInput(f"{shown} is not UTF-8, so not TOML: not written") from None


def _parsed(text: str, shown: Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{shown} {what} is not valid TOML ({exc}): not written") from None
    except RecursionError:
        raise BadInput(f"{shown} {what} nests too deep to read: not written") from None
    except ValueError as exc:  # an integer past the 4,300 digits Python converts
        raise BadInput(f"{shown} {what} cannot be read ({exc}): not written") from None


def _combined(old_text: str, old: dict[str, Any], text: str, table: dict[str, Any], shown: Path) -> str:
    """The new file's text, proven to keep what the old one said and to add exactly `table`."""
    tool = old.get("tool", {})
    if not isinstance(tool, dict):
        raise BadInput(f"{shown}: its `tool` is not a table, so [tool.dflashdoctor] cannot be added: not written")
    if "dflashdoctor" in tool:
        raise BadInput(f"{shown} already has [tool.dflashdoctor]: not written over")
    separator = "" if not old_text else "\n" if old_text.endswith("\n") else "\n\n"
    new_text = old_text + separator + text
    new = _parsed(new_text, shown, "with the table added")
    expected = {**old, "tool": {**tool, "dflashdoctor": table}}
    if _comparable(new) != _comparable(expected):
        raise BadInput(
            f"{shown}: the table added does not read back as written (an inline `tool` table, or a string "
            "init failed to quote): not written"
        )
    return new_text


def _comparable(value: Any) -> Any:
    """A parsed document in a form `==` compares as TOML means it: `nan` (which TOML allows) equals
    itself, as it does not as a float."""
    if isinstance(value, float) and math.isnan(value):
        return ("nan", math.copysign(1.0, value))
    if isinstance(value, dict):
        return {key: _comparable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_comparable(item) for item in value]
    return value


def _replace(folder_fd: int, shown: Path, data: bytes, old: os.stat_result | None) -> None:
    """Written under a random name, synced, then renamed over the old file (its mode kept) or linked
    to the free name."""
    temporary = f".{NAME}.{secrets.token_hex(8)}.tmp"
    mode = stat.S_IMODE(old.st_mode) if old is not None else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, mode, dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)  # the umask left out of the old file's mode
            os.fsync(handle.fileno())
        if old is None:
            os.link(temporary, NAME, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
        else:
            now = os.stat(NAME, dir_fd=folder_fd, follow_symlinks=False)
            if (now.st_ino, now.st_dev) != (old.st_ino, old.st_dev):
                raise BadInput(f"{shown} was replaced while init ran: not written")
            os.replace(temporary, NAME, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except FileExistsError:
        raise BadInput(f"{shown} appeared while init ran: not written") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=folder_fd)


def add_table(folder_fd: int, shown: Path, text: str, table: dict[str, Any]) -> None:
    """`text` (a `[tool.dflashdoctor]` table saying `table`) added to pyproject.toml in the open
    folder; `shown` is the file's path, for messages. BadInput for whatever stops it; the old file
    stays as it was."""
    owner = os.fstat(folder_fd).st_uid
    if owner not in trusted_uids():
        raise BadInput(f"{shown.parent} belongs to {user_name(owner)}: init writes nothing into another user's folder")
    old_text, old_status = _existing(folder_fd, shown)
    new_text = _combined(old_text, _parsed(old_text, shown, "as it is"), text, table, shown)
    try:
        _replace(folder_fd, shown, new_text.encode("utf-8"), old_status)
    except OSError as exc:
        why = "the file is immutable or the folder not writable" if exc.errno in (errno.EPERM, errno.EACCES) else ""
        raise BadInput(f"cannot write {shown}: {exc.strerror}{f' ({why})' if why else ''}: not written") from None
