"""Checks a Triton cache root, one key folder at a time, against how triton writes it.

Triton's `FileCacheManager.put` writes each file into `tmp.pid_<pid>_<uuid>/` inside the key folder
and `os.replace`s it into place; a compile writes its IR, binary and metadata `<name>.json`, then
the group file `__grp__<name>.json` (`{"child_paths": {file: absolute path}}`) last, as the commit
marker. A key folder is the base32 of a sha256 (52 characters); the metadata's `hash` is that sha256.
Folders holding only `<fn>.autotune.json` or a Python extension module that a triton driver built
(`cuda_utils`, `hip_utils`, `__triton_launcher`, each `<module><EXT_SUFFIX>`) have no group file by
design; a kernel binary is `<kernel>.so` at most, never with an interpreter tag.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import time
from pathlib import Path
from typing import Any

from dflashdoctor.cache.files import by_suffix, load_json
from dflashdoctor.cache.layout import TRITON_KEY, TRITON_TMP
from dflashdoctor.cache.model import Problem, RootScan, read_failure
from dflashdoctor.placed_files import kind_of
from dflashdoctor.processes import pid_alive

GROUP_PREFIX = "__grp__"
AUTOTUNE_SUFFIX = ".autotune.json"
# Tagged for the interpreter (triton 3.3 on), or, before, the driver's known module names untagged.
EXTENSION_MODULE = re.compile(r"^(\w+\.(cpython-[\w-]+|abi3)|(__triton_launcher|cuda_utils|hip_utils))\.so$")


def key_of(hash_hex: str) -> str | None:
    try:
        return base64.b32encode(bytes.fromhex(hash_hex)).decode("ascii").rstrip("=")
    except (ValueError, TypeError):
        return None


def _autotune_problem(path: str) -> str | None:
    data, error = load_json(path)
    if error:
        return error
    timings = data.get("configs_timings") if isinstance(data, dict) else None
    if not isinstance(data, dict) or "key" not in data or not isinstance(timings, list):
        return "autotune results lack `key` or `configs_timings`"
    if not all(isinstance(t, list) and len(t) == 2 and isinstance(t[0], dict) for t in timings):
        return "autotune `configs_timings` is not a list of [config, timing] pairs"
    return None


class _KeyFolder:
    """One key folder: its files, and what is wrong with it."""

    def __init__(self, folder: str, scan: RootScan, installed: str | None) -> None:
        self.folder = folder
        self.scan = scan
        self.installed = installed
        self.files: dict[str, int] = {}
        self.reasons: list[str] = []
        self.bad_files: list[str] = []
        self.stale: str | None = None
        self.same_folder: dict[str, bool] = {}  # a folder named by a group -> whether it is this one

    def bad(self, name: str, reason: str) -> None:
        self.reasons.append(f"{name}: {reason}")
        self.bad_files.append(self._path(name))

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def check(self) -> None:
        with os.scandir(self.folder) as entries:
            for entry in entries:
                self._entry(entry)
        groups = sorted(n for n in self.files if n.startswith(GROUP_PREFIX) and n.endswith(".json"))
        listed: set[str] = set()
        for group in groups:
            listed |= self._group(group)
        for name in sorted(self.files):
            if name.endswith(AUTOTUNE_SUFFIX):
                problem = _autotune_problem(self._path(name)) if self.files[name] else "empty file"
                if problem:
                    self.bad(name, problem)
            elif EXTENSION_MODULE.match(name):
                problem = by_suffix(self._path(name), self.files[name])
                if problem:
                    self.bad(name, problem)
        kernel_files = [n for n in self.files if not n.endswith(AUTOTUNE_SUFFIX) and not EXTENSION_MODULE.match(n)]
        if not groups and kernel_files:
            self.scan.problems.append(
                Problem(
                    "incomplete",
                    self.folder,
                    f"{len(kernel_files)} kernel files and no group file, the commit marker triton writes last "
                    "(triton recompiles the kernel; these files are dead weight)",
                    [self._path(n) for n in sorted(kernel_files)],
                )
            )
        if self.reasons:
            self.scan.problems.append(Problem("corrupt", self.folder, "; ".join(self.reasons), self.bad_files))
        elif self.stale:
            self.scan.problems.append(Problem("stale", self.folder, self.stale, []))

    def _entry(self, entry: os.DirEntry[str]) -> None:
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if not os.path.isfile(target):  # triton writes no links: a dangling one, a loop, a folder, a device
                self.bad(entry.name, f"symlink to {target}, which is {_link_target_kind(target)}")
                return
        if entry.is_dir():
            tmp = TRITON_TMP.fullmatch(entry.name)
            if tmp:
                self._tmp(Path(entry.path), int(tmp[1]))
            return
        try:
            size = entry.stat().st_size
        except FileNotFoundError:  # gone since the folder was listed (links were judged above)
            return
        except OSError as exc:  # a symlink loop
            self.bad(entry.name, f"cannot be read: {exc.strerror}")
            return
        self.files[entry.name] = size
        self.scan.files += 1
        self.scan.bytes += size

    def _tmp(self, path: Path, pid: int) -> None:
        if pid_alive(pid):
            self.scan.notes.append(f"{path}: a write in progress by process {pid}, which is running")
            return
        inside = sorted(str(p) for p in path.rglob("*") if p.is_file())
        self.scan.problems.append(
            Problem("orphan-tmp", str(path), f"temporary folder of process {pid}, which is no longer running", inside)
        )

    def _group(self, group: str) -> set[str]:
        """Checks one group and every child it lists; the children's names."""
        if not self.files[group]:
            self.bad(group, "empty group file")
            return set()
        data, error = load_json(self._path(group))
        if error:
            self.bad(group, error)
            return set()
        children = data.get("child_paths") if isinstance(data, dict) else None
        if not isinstance(children, dict) or not all(isinstance(p, str) for p in children.values()):
            self.bad(group, "group file has no `child_paths` mapping")
            return set()
        metadata = group.removeprefix(GROUP_PREFIX)
        if metadata not in children:
            self.bad(group, f"group does not list its metadata file {metadata}")
        for child, path in children.items():
            self._child(group, child, path, is_metadata=child == metadata)
        return set(children)

    def _in_this_folder(self, path: str) -> bool:
        """Whether `path`'s folder is this key folder: the same folder, not the same string, since a
        root reached through a link (clusters link ~/.triton to scratch) lists children by the other
        path. Triton itself only asks whether each stored path exists."""
        folder = os.path.dirname(os.path.normpath(path))
        if folder == self.folder:
            return True
        if not os.path.isabs(path):
            return False
        if folder not in self.same_folder:
            try:
                self.same_folder[folder] = os.path.samestat(os.stat(folder), self._identity)
            except OSError:
                self.same_folder[folder] = False
        return self.same_folder[folder]

    @functools.cached_property
    def _identity(self) -> os.stat_result:
        return os.stat(self.folder)

    def _child(self, group: str, child: str, path: str, *, is_metadata: bool) -> None:
        if os.path.basename(path) != child or not self._in_this_folder(path):
            self.bad(group, f"lists {child} at {path}, outside this folder (a copied or relocated cache)")
            return
        if child not in self.files:
            self.bad(child, f"listed by {group} but missing")
            return
        problem = by_suffix(self._path(child), self.files[child])
        if problem:
            self.bad(child, problem)
        elif is_metadata:
            self._metadata(child)

    def _metadata(self, name: str) -> None:
        data: Any = load_json(self._path(name))[0]
        if not isinstance(data, dict) or not isinstance(data.get("hash"), str):
            self.bad(name, "metadata has no `hash`")
            return
        if key_of(data["hash"]) != os.path.basename(self.folder):
            self.bad(name, f"metadata hash {data['hash'][:16]}... belongs to another key folder")
            return
        version = data.get("triton_version")
        if self.installed and version and version != self.installed:
            self.stale = f"compiled by triton {version}; the installed triton {self.installed} never reads it"


def scan_triton(root: Path, source: str, installed: str | None) -> RootScan:
    scan = RootScan("triton", str(root), source)
    started = time.perf_counter()
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and TRITON_KEY.fullmatch(entry.name):
                scan.entries += 1
                try:
                    _KeyFolder(entry.path, scan, installed).check()
                except FileNotFoundError:  # a file or temporary folder gone since it was listed
                    continue
                except OSError as exc:  # unreadable folder or file: a finding, never a crash
                    scan.problems.append(read_failure(entry.path, exc))
            elif entry.is_dir(follow_symlinks=False):
                scan.notes.append(f"{entry.path}: not a triton key folder, left alone")
    scan.seconds = round(time.perf_counter() - started, 3)
    return scan


def _link_target_kind(target: str) -> str:
    """What a link that is no regular file leads to, in words: `/dev/zero` is a character device,
    not "missing"."""
    try:
        return kind_of(os.stat(target).st_mode)
    except FileNotFoundError:
        return "missing"
    except OSError:  # ELOOP, or a folder on the way it may not enter
        return "unreachable (a link loop, or a folder it cannot enter)"
