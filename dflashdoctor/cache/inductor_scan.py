"""Checks an Inductor cache root against how torch writes it (cache/layout.py says where from).

Layout: `fxgraph/<shard>/<key>/<entry>` and `aotautograd/<key>/<entry>` (pickled: checked for
presence and size, never unpickled); two-character shard folders of generated code (`.py`, which must
`compile()`; `.cpp`/`.h` text; `.so` ELF; `.best_config` and `.json` JSON); `*.lock` in `locks/`
folders (filelock leaves them, empty, by design: not reported); `triton/<device>/` (Triton roots,
scanned as such). torch writes through `.<pid>.<thread>.tmp` then rename, so a leftover one is an
interrupted write; a C++ kernel's `.so`/`.o` it lets the compiler write in place under
`locks/<key>.lock`, so a bad one is judged only when no compile holds that lock (a scan beside
another job's compile called its half-built `.so` files broken, and `fix` beside a compile of six
kernels moved all six into quarantine). In a cache root, what the scan finds outside that layout
is no cache entry: it is named in the notes and `fix` leaves it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from dflashdoctor.cache.files import by_suffix
from dflashdoctor.cache.layout import INDUCTOR_TMP, inductor_lock, is_cache_entry, not_a_cache
from dflashdoctor.cache.model import Problem, ProblemKind, RootScan, read_failure
from dflashdoctor.placed_files import kind_of
from dflashdoctor.processes import pid_alive
from dflashdoctor.safe_fs import closing

_ENTRY_TREES = ("fxgraph", "aotautograd")  # one folder per cache entry, files inside pickled
_SKIPPED = ("locks", "triton")  # lock files by design; Triton roots checked on their own
# torch makes an entry's folder and writes its file into it at once (write_atomic, make_dirs): one
# found empty and younger than this is a write about to happen (seen beside a real compile)
_FRESH_FOLDER_S = 60.0


def _not_a_plain_file(path: str) -> str | None:
    """Why a file in the root is not one torch wrote: torch writes regular files only."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return f"a symbolic link to {os.readlink(path)!r}, which torch never writes (not followed)"
    if not stat.S_ISREG(mode):
        return f"{kind_of(mode)}, not a regular file (not read)"
    return None


def held_by_a_writer(lock_path: str, owner_uid: int) -> bool:
    """Whether a process holds the flock on `lock_path` now: torch's FileLock holds
    `locks/<key>.lock` while its compiler writes `<key>.*.so` in place, so an empty or half-written
    file under a held lock is a compile in progress, not damage. Opened without following links or
    blocking (a FIFO planted there never stalls the scan); a lock file of another owner than the
    entry's does not count (nobody else hides an entry by holding a lock of their own). The shared lock
    is dropped at once: a compile that asks for it in that microsecond waits one filelock poll."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with closing(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner_uid:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a filesystem without flock: nothing to tell
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False


class _InductorScan:
    def __init__(self, root: Path, source: str) -> None:
        self.root = str(root)
        self.scan = RootScan("inductor", str(root), source)

    def run(self) -> RootScan:
        started = time.perf_counter()
        with os.scandir(self.root) as entries:
            for entry in entries:
                path = entry.path
                if entry.name in _SKIPPED and entry.is_dir(follow_symlinks=False):
                    continue
                if entry.name in _ENTRY_TREES and entry.is_dir(follow_symlinks=False):
                    self._entry_tree(path)
                elif entry.is_dir(follow_symlinks=False):
                    self._files_under(path)
                else:
                    self._file(path)
        self.scan.seconds = round(time.perf_counter() - started, 3)
        return self.scan

    def _entry_tree(self, tree: str) -> None:
        """Each leaf folder is one entry: present, and every file in it non-empty."""
        for folder, dirs, files in os.walk(tree, onerror=self._walk_error):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            if dirs or not files:
                if not dirs and not files and folder != tree:
                    self._empty_entry_folder(folder)
                continue
            self.scan.entries += 1
            reasons, bad = [], []
            for name in files:
                path = os.path.join(folder, name)
                if self._tmp(path):
                    continue
                size = self._size(path)
                if size is None and not os.path.lexists(path):
                    continue  # gone since the folder was listed: nothing to judge
                if size is None or size == 0:
                    reasons.append(f"{name}: {'empty file' if size == 0 else 'cannot be read'}")
                    bad.append(path)
            if reasons:
                self._problem("corrupt", folder, "; ".join(reasons), bad)

    def _files_under(self, folder: str) -> None:
        for parent, dirs, files in os.walk(folder, onerror=self._walk_error):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(parent, d))]
            for name in files:
                self._file(os.path.join(parent, name))

    def _file(self, path: str) -> None:
        if self._tmp(path):
            return
        if path.endswith(".lock"):  # filelock's lock files: empty, and left in place, by design
            self._size(path)
            return
        size = self._size(path)
        if size is None and not os.path.lexists(path):
            return  # gone since its folder was listed (a compiler's scratch folder is removed)
        self.scan.entries += 1
        if size is None:
            self._problem("corrupt", path, "cannot be read (a dangling link or a link loop)", [path])
            return
        not_plain = _not_a_plain_file(path)
        if not_plain:  # never read through: a link may lead anywhere, a FIFO would block the read
            self._problem("corrupt", path, not_plain, [path])
            return
        try:
            problem = by_suffix(path, size)
            if problem and self._being_compiled(path):
                return
            if problem:  # the compile may have ended between the read and the lock's test
                problem = by_suffix(path, os.lstat(path).st_size)
        except FileNotFoundError:  # gone since its folder was listed
            return
        except OSError as exc:  # unreadable: a finding, never a crash
            self.scan.problems.append(read_failure(path, exc))
            return
        if problem:
            self._problem("corrupt", path, problem, [path])

    def _being_compiled(self, path: str) -> bool:
        lock = inductor_lock(self.root, path)
        if lock is None or not held_by_a_writer(lock, os.lstat(path).st_uid):
            return False
        self.scan.notes.append(f"{path}: being written by a compile that holds {lock}: not judged")
        return True

    def _walk_error(self, exc: OSError) -> None:
        """os.walk skips a folder it cannot list unless told: that folder is a finding, unless it is
        gone (torch removes the compiler's `<key>.<name>_CxxBuild` folder when a build ends)."""
        if exc.errno != errno.ENOENT:
            self.scan.problems.append(read_failure(exc.filename or self.root, exc))

    def _empty_entry_folder(self, folder: str) -> None:
        try:
            age = time.time() - os.lstat(folder).st_mtime
        except FileNotFoundError:
            return
        if 0 <= age < _FRESH_FOLDER_S:
            self.scan.notes.append(f"{folder}: an entry folder made {age:.1f} s ago, not yet written: not judged")
        else:
            self._problem("corrupt", folder, "empty cache entry folder", [])

    def _size(self, path: str) -> int | None:
        try:
            size = os.stat(path).st_size
        except OSError:
            return None
        self.scan.files += 1
        self.scan.bytes += size
        return size

    def _tmp(self, path: str) -> bool:
        match = INDUCTOR_TMP.fullmatch(os.path.basename(path))
        if not match:
            return False
        pid = int(match[1])
        if pid_alive(pid):
            self.scan.notes.append(f"{path}: a write in progress by process {pid}, which is running")
        else:
            gone = f"temporary file of process {pid}, which is no longer running"
            self._problem("orphan-tmp", path, gone, [path])
        return True

    def _problem(self, kind: ProblemKind, path: str, reason: str, files: list[str]) -> None:
        self.scan.problems.append(Problem(kind, path, reason, files))


def _outside_the_layout_to_notes(scan: RootScan) -> None:
    """In a cache root, a problem found outside the layout torch writes (a file of another name in a
    shard, a folder under `dynamo/`) is no broken cache entry: it becomes a note, and `fix` leaves it.
    A folder that cannot be read stays reported whatever its name: nobody can see what is in it, and
    nothing moves it."""
    kept = []
    for problem in scan.problems:
        parts = tuple(os.path.relpath(problem.entry, scan.path).split(os.sep))
        if problem.kind == "unreadable" or is_cache_entry("inductor", parts):
            kept.append(problem)
        else:
            scan.notes.append(f"{problem.entry}: not a cache entry torch writes, left alone ({problem.reason})")
    scan.problems = kept


def scan_inductor(root: Path, source: str) -> RootScan:
    """A folder that is no cache root at all (a project named by mistake) keeps everything found as
    found: `check` says what it sees there, and `fix` refuses the folder whole."""
    scan = _InductorScan(root, source).run()
    if not_a_cache(root) is None:
        _outside_the_layout_to_notes(scan)
    return scan
