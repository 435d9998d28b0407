"""Whose code dflashdoctor runs: a file another local user could have written is never run, nor a
folder they could add modules to ever put on a probe's import path, unless the user says so.

The gate runs what its configuration names (`run`, `target`, `script`), and it is run as root on
shared nodes, in team folders and CI checkouts: a `dflashdoctor.toml` another user planted in a
folder they can write would otherwise be run as root. So, as git does for a repository since its
safe.directory fix and as ssh judges an authorized_keys file:
- a file whose code runs (the configuration, the target's file, the script) must belong to this
  user or root (trusted_uids) and be writable by no one else, and every folder from `/` down to it
  must belong to this user or root and be writable by no one else unless it is sticky (in a sticky
  folder others may add names but not replace this user's); a link on the way must be this user's
  or root's (safe_paths.py);
- a folder Python will search for modules by name (the current folder on a probe's path, the
  target's or the script's folder) must in addition be writable by no one else at all, sticky or
  not: in /tmp anyone can add a `torch.py`.
A folder's group counts as others unless it is the owner's own private group (named as the owner,
with no other member). What the user vouches for (`--trust PATH`, or `trust = [...]` in a
configuration that passed these rules) is taken as it is: a path at or below a trusted one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import grp
import importlib.machinery
import itertools
import os
import pwd
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.safe_fs import user_name
from dflashdoctor.safe_paths import PathRefused, locate, open_folder, resolve_links, trusted_uids

TRUST_HINT = "pass --trust PATH (or list it in `trust` of your own configuration) if you trust whoever can change it"


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


def _others_write(info: os.stat_result) -> str | None:
    """Who besides the owner can write it, in words; None when no one."""
    mode = info.st_mode
    if mode & 0o002:
        return "everyone"
    if mode & 0o020 and not _private_group(info.st_gid, info.st_uid):
        try:
            return f"the group {grp.getgrgid(info.st_gid).gr_name}"
        except KeyError:
            return f"the group {info.st_gid}"
    return None


def _owner_problem(info: os.stat_result) -> str | None:
    if info.st_uid not in trusted_uids():
        return f"belongs to {user_name(info.st_uid)}"
    return None


def folder_on_the_way(_shown: str, info: os.stat_result) -> str | None:
    """A folder a trusted file sits below: this user's or root's, and no one else may rename in it
    (sticky, or not writable by others). Said of the folder, which safe_paths names."""
    owner = _owner_problem(info)
    if owner:
        return owner
    writers = _others_write(info)
    if writers and not info.st_mode & stat.S_ISVTX:
        return f"can be written by {writers} (mode {stat.S_IMODE(info.st_mode):o}, not sticky)"
    return None


def _import_folder_problem(info: os.stat_result) -> str | None:
    """A folder searched for modules by name: no one else may add one to it, sticky or not."""
    owner = _owner_problem(info)
    if owner:
        return owner
    writers = _others_write(info)
    return f"can be written by {writers} (mode {stat.S_IMODE(info.st_mode):o})" if writers else None


@dataclass(frozen=True)
class Trust:
    """What this user vouched for: paths at or below these are run as they are."""

    vouched: tuple[Path, ...] = field(default_factory=tuple)

    def with_paths(self, paths: Sequence[str | os.PathLike[str]], base: Path) -> Trust:
        """More vouched-for paths (relative ones from `base`), as given and with their links resolved,
        so that a file named either way is found under one."""
        added: list[Path] = []
        for path in paths:
            given = _absolute(base / Path(path))
            added += [given, *_real(given)]
        return Trust(self.vouched + tuple(added))

    def vouches_for(self, path: Path) -> bool:
        candidates = {_absolute(path), *_real(_absolute(path))}
        return any(c == v or v in c.parents for c in candidates for v in self.vouched)

    def file_problem(self, path: Path | str, role: str) -> str | None:
        """Why the file at `path`, whose code runs as `role`, may not be run; None when it may.
        One line naming the file, what is wrong, and how to vouch for it."""
        path = Path(path)
        if self.vouches_for(path):
            return None
        reason = _file_reason(path)
        return f"refusing {role} {path}: {reason}; {TRUST_HINT}" if reason else None

    def import_folder_problem(self, folder: Path | str, role: str) -> str | None:
        """Why modules may not be imported by name from `folder` (`role` says why it would be)."""
        folder = Path(folder)
        if self.vouches_for(folder):
            return None
        reason = _folder_reason(folder)
        return f"refusing {role} {folder}: {reason}; {TRUST_HINT}" if reason else None


_VOUCHED: contextvars.ContextVar[Trust | None] = contextvars.ContextVar("dflashdoctor_vouched", default=None)


@contextlib.contextmanager
def trusting(trust: Trust) -> Iterator[None]:
    """What the user vouched for, seen by everything started meanwhile in this context (the gate's
    probes, each in a thread that copies it): the runner puts the current folder on a probe's path
    by it."""
    token = _VOUCHED.set(trust)
    try:
        yield
    finally:
        _VOUCHED.reset(token)


def vouched() -> Trust:
    return _VOUCHED.get() or Trust()


def _real(path: Path) -> list[Path]:
    """Where `path` really is, reached as safe_paths reaches it: none where the way holds a link
    another user made (trusting a link of theirs must not extend trust to wherever they point it)."""
    try:
        fd = open_folder(path)
    except NotADirectoryError:
        try:
            located = resolve_links(locate(path))
        except (OSError, ValueError):
            return []
        try:
            return [Path(os.readlink(f"/proc/self/fd/{located.fd}")) / located.name]
        except OSError:
            return []
        finally:
            located.close()
    except OSError:
        return []
    try:
        return [Path(os.readlink(f"/proc/self/fd/{fd}"))]
    except OSError:
        return []
    finally:
        os.close(fd)


def _absolute(path: Path) -> Path:
    return Path(os.path.normpath(os.path.join(os.getcwd(), path)))


def _said(refused: PathRefused, full: str) -> str:
    """What was found on the way, said of the path itself where it is the one refused."""
    if os.path.normpath(refused.path) == os.path.normpath(full):
        return f"it {refused.reason}"
    return f"{refused.path}, on the way to it, {refused.reason}"


def _file_reason(path: Path) -> str | None:
    """Why the regular file at `path` may not be run. What is missing or not a regular file is not
    judged here: it runs nothing, and the reader says what it is (placed_files, the probe)."""
    full = os.path.join(os.getcwd(), path)
    try:
        located = resolve_links(locate(full, check=folder_on_the_way), folder_on_the_way)
    except PathRefused as exc:
        return _said(exc, full)
    except (FileNotFoundError, ValueError):  # nothing there, or a path that names a folder (`.`)
        return None
    except OSError as exc:
        return f"it cannot be reached ({exc.strerror or exc})"
    try:
        info = os.stat(located.name, dir_fd=located.fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        located.close()
    if not stat.S_ISREG(info.st_mode):
        return None
    writers = _others_write(info)
    problem = _owner_problem(info) or (
        f"can be written by {writers} (mode {stat.S_IMODE(info.st_mode):o})" if writers else None
    )
    return f"it {problem}" if problem else None


def _folder_reason(folder: Path) -> str | None:
    full = os.path.join(os.getcwd(), folder)
    try:
        fd = open_folder(full, check=folder_on_the_way)
    except PathRefused as exc:
        return _said(exc, full)
    except OSError as exc:
        return f"it cannot be reached ({exc.strerror or exc})"
    try:
        problem = _import_folder_problem(os.fstat(fd))
        if problem:
            return f"it {problem}, so anyone could add a module that would be imported"
        return _foreign_module(fd)
    finally:
        os.close(fd)


_MODULE_SUFFIXES = tuple(importlib.machinery.all_suffixes())  # .py, .pyc, extension modules
_ENTRIES_LOOKED_AT = 100_000


def _foreign_module(folder_fd: int) -> str | None:
    """A module or package folder at the top of the folder that another user owns or can change:
    `import torch` there imports their `torch.py` (or `torch/`, which they can fill) first."""
    with os.scandir(folder_fd) as entries:
        for entry in itertools.islice(entries, _ENTRIES_LOOKED_AT):
            with contextlib.suppress(OSError):
                if not (entry.name.endswith(_MODULE_SUFFIXES) or entry.is_dir(follow_symlinks=False)):
                    continue
                info = entry.stat(follow_symlinks=False)
                writers = _others_write(info)
                if info.st_uid not in trusted_uids() or (writers and not stat.S_ISLNK(info.st_mode)):
                    whose = _owner_problem(info) or f"can be written by {writers}"
                    return f"it holds {entry.name}, which {whose}: importing that name would run it"
    return None
