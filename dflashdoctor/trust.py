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
import importlib.machinery
import itertools
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.safe_fs import others_can_write, trusted_uids, user_name
from dflashdoctor.safe_paths import PathRefused, locate, open_folder, resolve_links

TRUST_HINT = "pass --trust PATH (or list it in `trust` of your own configuration) if you trust whoever can change it"


def _loose(info: os.stat_result, *, sticky_ok: bool) -> str | None:
    """Why what `info` describes is not this user's alone, as a predicate ("belongs to nobody",
    "can be written by everyone (mode 777)"); `sticky_ok`: a sticky folder others can write is
    fine (they may add names, not replace this user's)."""
    if info.st_uid not in trusted_uids():
        return f"belongs to {user_name(info.st_uid)}"
    writers = others_can_write(info)
    if not writers or (sticky_ok and info.st_mode & stat.S_ISVTX):
        return None
    sticky = ", not sticky" if sticky_ok else ""
    return f"can be written by {writers} (mode {stat.S_IMODE(info.st_mode):o}{sticky})"


def folder_on_the_way(_shown: str, info: os.stat_result) -> str | None:
    """A folder a trusted file sits below: this user's or root's, and no one else may rename in it
    (sticky, or not writable by others). Said of the folder, which safe_paths names."""
    return _loose(info, sticky_ok=True)


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


def file_reason(path: Path) -> str | None:
    """Why a file at `path` is not this user's alone to change (another user owns it or a folder
    on its way), or None: for what reads a file without running it (lint's table)."""
    return _file_reason(path)


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
    problem = _loose(info, sticky_ok=False)
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
        problem = _loose(os.fstat(fd), sticky_ok=False)  # in a sticky folder too, anyone may add a name
        if problem:
            return f"it {problem}, so anyone could add a module that would be imported"
        return _foreign_module(fd)
    finally:
        os.close(fd)


_MODULE_SUFFIXES = tuple(importlib.machinery.all_suffixes())  # .py, .pyc, extension modules
_ENTRIES_LOOKED_AT = 100_000


def _foreign_module(folder_fd: int) -> str | None:
    """A module or package folder at the top of the folder that another user owns or can change:
    `import torch` there imports their `torch.py` (or `torch/`, which they can fill) first. A link
    there is judged with what it leads to (a link of root's to another user's file is their code)."""
    with os.scandir(folder_fd) as entries:
        for entry in itertools.islice(entries, _ENTRIES_LOOKED_AT):
            with contextlib.suppress(OSError):
                if not (entry.name.endswith(_MODULE_SUFFIXES) or entry.is_dir()):
                    continue
                link = entry.is_symlink()
                problem = (_owner_link(entry.stat(follow_symlinks=False)) if link else None) or _loose(
                    entry.stat(), sticky_ok=False
                )
                if problem:
                    return f"it holds {entry.name}, which {problem}: importing that name would run it"
    return None


def _owner_link(info: os.stat_result) -> str | None:
    return None if info.st_uid in trusted_uids() else f"is a link made by {user_name(info.st_uid)}"
