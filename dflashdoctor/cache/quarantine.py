"""Moving broken entries aside, whole, and putting them back byte-identical. Nothing is deleted.

A fix writes its manifest first (every entry's original path, its files' sha256 and size, the
reason), atomically, and only then moves entries, each with one `rename` (atomic on one filesystem;
the quarantine sits beside the root for that reason). So the filesystem itself records how far a fix
got: an entry is moved exactly when its stored copy exists and its original does not. A fix killed at
any point is finished by the next `fix` and undone by `restore`, from the manifest.

The quarantine is trusted only as far as it is checked, because fix and restore move files for
whoever runs them, often root, and a root's quarantine may sit in a world-writable folder (the
default Inductor cache is in the temp folder). Its folders and manifests must belong to the user who
runs the command (or root) and be writable by nobody else; new ones are made private (0700). Every
path in a manifest must be a chain of plain names below the root (`original`) or below the
quarantine (`stored`), walked without following links; a manifest with any entry that fails this
is refused whole, and nothing of it moves. And a fix moves only what has the shape of a cache entry
(cache/layout.py), whether a scan or a manifest it finishes names it: a user's file in a root set by
mistake is never one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dflashdoctor.cache import manifest as manifests
from dflashdoctor.cache.inventory import inventory
from dflashdoctor.cache.layout import is_cache_entry
from dflashdoctor.cache.lock import root_lock
from dflashdoctor.cache.manifest import ENTRIES, MANIFEST, Manifest, ManifestEntry, ManifestError, shown
from dflashdoctor.cache.model import Problem
from dflashdoctor.cache.repair_log import EntryOutcome, QuarantineRun, Refusal
from dflashdoctor.safe_fs import (
    PRIVATE_FOLDER,
    Untrusted,
    closing,
    descend,
    exists_in,
    open_child_folder,
    open_named_folder,
    planted_link,
    read_private_file,
    refused_because,
    untrusted_reason,
    user_name,
    write_private_file,
)

SUFFIX = ".dflashdoctor-quarantine"
RESTORED = "restored.json"
FIXABLE = ("corrupt", "incomplete", "orphan-tmp")  # stale entries are another triton's, not broken


def home_of(root: Path) -> Path:
    return root.parent / f"{root.name}{SUFFIX}"


def root_of(home: Path) -> Path | None:
    """The root a quarantine folder (named `<root>.dflashdoctor-quarantine`) belongs to."""
    return home.parent / home.name.removesuffix(SUFFIX) if home.name.endswith(SUFFIX) and home.name != SUFFIX else None


class Refused(Exception):
    """A manifest with entries that cannot be believed."""

    def __init__(self, path: str, reasons: list[str]) -> None:
        super().__init__(f"{path}: {reasons[0]}")
        self.refusal = Refusal(path, reasons)


@dataclass
class _Loaded:
    name: str
    fd: int
    manifest: Manifest
    restored: bool


def _outermost(problems: list[Problem]) -> list[Problem]:
    """Entries to move: a temp folder inside a broken key folder moves with it, not on its own."""
    chosen: list[Problem] = []
    for problem in sorted(problems, key=lambda p: len(Path(p.entry).parts)):
        path = Path(problem.entry)
        if not any(path == Path(c.entry) or Path(c.entry) in path.parents for c in chosen):
            chosen.append(problem)
    return chosen


@contextlib.contextmanager
def _parent(base_fd: int, names: tuple[str, ...], *, private: bool = False) -> Iterator[int | None]:
    """The folder holding the last of `names`, or None when a folder on the way is missing."""
    try:
        fd = descend(base_fd, names[:-1], private=private)
    except FileNotFoundError:
        yield None
        return
    with closing(fd):
        yield fd


@contextlib.contextmanager
def _made_parent(base_fd: int, names: tuple[str, ...], *, create: int, private: bool = False) -> Iterator[int]:
    """The folder holding the last of `names`, the missing folders on the way made with mode `create`."""
    with closing(descend(base_fd, names[:-1], create=create, private=private)) as fd:
        yield fd


def open_root(parent_fd: int, root: Path) -> int:
    """The cache root `fix` and `restore` move through, opened once by its name in `parent_fd`.

    A teammate who can write the root's parent (a team scratch folder, mode 2775) could swap the root
    for a link or a folder of theirs between two runs: then root's files would be carried into their
    folder, or theirs into root's. So the root is a folder this user or root owns, opened without
    following a link, unless the link itself is one nobody else could have put or replaced there
    (its folder writable by its owner alone, or sticky and the link this user's or the folder
    owner's). Untrusted otherwise."""
    info = os.stat(root.name, dir_fd=parent_fd, follow_symlinks=False)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    if stat.S_ISLNK(info.st_mode):
        parent = os.fstat(parent_fd)
        sticky_and_ours = parent.st_mode & stat.S_ISVTX and info.st_uid in (os.geteuid(), parent.st_uid)
        if parent.st_mode & 0o022 and not sticky_and_ours:
            raise Untrusted(
                str(root),
                f"a link in a folder others can write ({root.parent}, mode {stat.S_IMODE(parent.st_mode):o}): "
                "another user could have swapped it",
            )
    else:
        flags |= os.O_NOFOLLOW  # swapped for a link since the stat above: ELOOP
    try:
        fd = os.open(root.name, flags, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Untrusted(str(root), refused_because(exc)) from None
        raise
    owner = os.fstat(fd).st_uid
    if owner not in (os.geteuid(), 0):
        os.close(fd)
        raise Untrusted(str(root), f"owned by {user_name(owner)}, not by {user_name(os.geteuid())}, who runs this")
    return fd


class QuarantineHome:
    """A root's quarantine folder (`<root>.dflashdoctor-quarantine/`), opened and checked once, with
    the root opened beside it. Every move goes through these two open folders."""

    def __init__(self, root: Path, root_fd: int, fd: int) -> None:
        self.root = root
        self.path = home_of(root)
        self.root_fd = root_fd
        self.fd = fd

    @classmethod
    def open(cls, root: Path, *, create: bool) -> QuarantineHome | None:
        """The checked home of `root`; None when there is none and `create` is false.
        Untrusted when it is not the user's own or is writable by others; OSError when it cannot be
        made or opened."""
        home = home_of(root)
        try:
            parent = open_named_folder(root.parent)
        except FileNotFoundError:
            if create:
                raise
            return None
        with closing(parent) as parent_fd:
            reason = planted_link(parent_fd, root.name)
            if reason:
                raise Untrusted(str(root), reason)
            fd = cls._open_home(parent_fd, home, create)
            if fd is None:
                return None
            try:  # by its name in the folder just checked, so the link rule above holds for it
                root_fd = open_root(parent_fd, root)
            except BaseException:
                os.close(fd)
                raise
        return cls(root, root_fd, fd)

    @staticmethod
    def _open_home(parent_fd: int, home: Path, create: bool) -> int | None:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(home.name, PRIVATE_FOLDER, dir_fd=parent_fd)
        try:
            fd = open_child_folder(parent_fd, home.name)
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Untrusted(str(home), refused_because(exc)) from None
            raise
        reason = untrusted_reason(os.fstat(fd))
        if reason:
            os.close(fd)
            raise Untrusted(str(home), reason)
        return fd

    def __enter__(self) -> QuarantineHome:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)
        os.close(self.root_fd)

    def lock(self, wait_s: float) -> contextlib.AbstractContextManager[None]:
        return root_lock(self.fd, str(self.path), wait_s)

    def names(self) -> list[str]:
        """Its quarantine folders (those with a manifest), oldest first: their names are UTC stamps."""
        found = []
        for name in sorted(os.listdir(self.fd)):
            with contextlib.suppress(OSError):
                os.stat(f"{name}/{MANIFEST}", dir_fd=self.fd, follow_symlinks=False)
                found.append(name)
        return found

    # -- reading a quarantine back, checked before it is believed

    def _load(self, name: str) -> _Loaded:
        """Untrusted, ManifestError or OSError when it cannot be believed."""
        where = str(self.path / name)
        try:
            fd = open_child_folder(self.fd, name)
        except OSError as exc:
            raise Untrusted(where, refused_because(exc)) from None
        try:
            reason = untrusted_reason(os.fstat(fd))
            if reason:
                raise Untrusted(where, reason)
            try:
                manifest = manifests.loads(read_private_file(fd, MANIFEST))
            except Untrusted as exc:
                raise Untrusted(f"{where}/{MANIFEST}", exc.reason) from None
            self._check_root(manifest)
            refused = manifest.refused + [(e.index, r) for e in manifest.entries if (r := self._path_problem(fd, e))]
            if refused:
                raise Refused(f"{where}/{MANIFEST}", [f"entry {i}: {why}" for i, why in sorted(refused)])
            return _Loaded(name, fd, manifest, exists_in(fd, RESTORED))
        except BaseException:
            os.close(fd)
            raise

    def _check_root(self, manifest: Manifest) -> None:
        if manifest.root == str(self.root):
            return
        try:
            same = os.path.samestat(os.stat(manifest.root), os.fstat(self.root_fd))
        except OSError:
            same = False
        if not same:
            raise ManifestError(f"it was written for the root {shown(manifest.root)}, not for {self.root}")

    def _path_problem(self, folder_fd: int, entry: ManifestEntry) -> str | None:
        """Why an entry's folders cannot be walked without leaving the root or the quarantine."""
        for what, base, names, private, as_written in (
            ("original", self.root_fd, entry.below_root, False, entry.original),
            ("stored", folder_fd, entry.stored, True, "/".join(entry.stored)),
        ):
            try:
                os.close(descend(base, names[:-1], private=private))
            except FileNotFoundError:
                continue  # a folder still to be made: nothing there can lead elsewhere
            except Untrusted as exc:
                return f"{what} {shown(as_written)}: its folder {shown(exc.path)} is {exc.reason}"
            except OSError as exc:
                return f"{what} {shown(as_written)}: its folder {shown(exc.filename)} is {refused_because(exc)}"
        return None

    def _loaded_quarantines(
        self, names: list[str], refusals: list[Refusal], *, named: bool = False
    ) -> Iterator[_Loaded]:
        """Each quarantine that can be believed; the others become refusals. A manifest that cannot
        be read at all, in a quarantine the user `named`, raises ManifestError (bad input)."""
        for name in names:
            try:
                loaded = self._load(name)
            except Refused as exc:
                refusals.append(exc.refusal)
                continue
            except Untrusted as exc:
                refusals.append(Refusal(exc.path, [exc.reason]))
                continue
            except ManifestError as exc:
                if named:
                    where = self.path / name / MANIFEST
                    raise ManifestError(f"{where} is not a readable quarantine manifest ({exc})") from None
                refusals.append(Refusal(str(self.path / name / MANIFEST), [str(exc)]))
                continue
            except OSError as exc:
                refusals.append(Refusal(str(self.path / name), [f"cannot be read: {refused_because(exc)}"]))
                continue
            with closing(loaded.fd):
                yield loaded

    # -- fix

    def resume_unfinished(self, refusals: list[Refusal]) -> list[QuarantineRun]:
        """Finishes the quarantines a killed fix left half-done: some entry still at its original place."""
        runs = []
        for loaded in self._loaded_quarantines(self.names(), refusals):
            kind = loaded.manifest.kind
            entries = [e for e in loaded.manifest.entries if is_cache_entry(kind, e.below_root)]
            if not loaded.restored and any(self._pending(loaded.fd, e) for e in entries):
                runs.append(self._move_in(loaded.fd, loaded.name, entries))
        return runs

    def _pending(self, folder_fd: int, entry: ManifestEntry) -> bool:
        return self._where(self.root_fd, entry.below_root, False) and not self._where(folder_fd, entry.stored, True)

    @staticmethod
    def _where(base_fd: int, names: tuple[str, ...], private: bool) -> bool:
        try:
            with _parent(base_fd, names, private=private) as parent:
                return parent is not None and exists_in(parent, names[-1])
        except (OSError, Untrusted):
            return False

    def quarantine(self, kind: str, problems: list[Problem]) -> QuarantineRun | None:
        """Moves each fixable problem's entry, whole, into a new quarantine folder: only entries of the
        layout `kind` writes."""
        below = {p.entry: Path(p.entry).relative_to(self.root).parts for p in problems if p.kind in FIXABLE}
        chosen = _outermost([p for p in problems if p.entry in below and is_cache_entry(kind, below[p.entry])])
        if not chosen:
            return None
        entries: list[ManifestEntry] = []
        unreadable: list[EntryOutcome] = []
        for problem in chosen:
            below_root = below[problem.entry]
            try:
                with _parent(self.root_fd, below_root) as parent:
                    files = inventory(parent, below_root[-1]) if parent is not None else None
            except (OSError, Untrusted) as exc:
                detail = refused_because(exc) if isinstance(exc, OSError) else str(exc)
                unreadable.append(EntryOutcome(problem.entry, "failed", f"not moved: cannot be read ({detail})"))
                continue
            if files is None:  # gone since the scan
                continue
            entries.append(
                ManifestEntry(
                    index=len(entries),
                    original=problem.entry,
                    below_root=below_root,
                    stored=(ENTRIES, *below_root),
                    files=tuple(files),
                    reason=problem.reason,
                    kind=problem.kind,
                )
            )
        if not entries:
            return QuarantineRun(str(self.path), unreadable) if unreadable else None
        stamp, folder_fd = self._new_folder()
        with closing(folder_fd):
            data = manifests.build(str(self.root), kind, stamp, entries)
            write_private_file(folder_fd, MANIFEST, data)  # before any move: a kill after this loses nothing
            run = self._move_in(folder_fd, stamp, entries)
        run.outcomes += unreadable
        return run

    def _new_folder(self) -> tuple[str, int]:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        for attempt in range(1000):
            name = stamp if attempt == 0 else f"{stamp}-{attempt}"
            try:
                os.mkdir(name, PRIVATE_FOLDER, dir_fd=self.fd)
            except FileExistsError:
                continue
            return name, open_child_folder(self.fd, name)
        raise FileExistsError(errno.EEXIST, "no free quarantine name", str(self.path / stamp))

    def _move_in(self, folder_fd: int, name: str, entries: list[ManifestEntry]) -> QuarantineRun:
        run = QuarantineRun(str(self.path / name))
        for entry in entries:
            run.outcomes.append(self._move_entry_in(folder_fd, entry))
        return run

    def _move_entry_in(self, folder_fd: int, entry: ManifestEntry) -> EntryOutcome:
        original, stored = entry.below_root, entry.stored
        try:
            with (
                _parent(self.root_fd, original) as source,
                _made_parent(folder_fd, stored, create=PRIVATE_FOLDER, private=True) as target,
            ):
                at_original = source is not None and exists_in(source, original[-1])
                if exists_in(target, stored[-1]):
                    detail = "" if not at_original else "rebuilt at its place since; the rebuilt one is left there"
                    return EntryOutcome(entry.original, "already-moved", detail)
                if source is None or not at_original:
                    return EntryOutcome(entry.original, "missing", "gone before it could be moved")
                os.rename(original[-1], stored[-1], src_dir_fd=source, dst_dir_fd=target)
        except Untrusted as exc:
            return EntryOutcome(entry.original, "failed", f"not moved: {exc}")
        except OSError as exc:  # another filesystem, no permission, a link on the way: left where it is
            return EntryOutcome(entry.original, "failed", f"not moved: {refused_because(exc)}")
        return EntryOutcome(entry.original, "moved", entry.reason)

    # -- restore

    def restore(self, only: str | None = None) -> tuple[list[QuarantineRun], list[Refusal], int]:
        """Puts back every quarantine not yet restored, oldest first (or only the one named): the runs,
        the refusals, and how many quarantines there are."""
        names = self.names() if only is None else [only]
        refusals: list[Refusal] = []
        runs = []
        for loaded in self._loaded_quarantines(names, refusals, named=only is not None):
            if loaded.restored and only is None:
                continue
            runs.append(self._restore(loaded))
        return runs, refusals, len(names)

    def _restore(self, loaded: _Loaded) -> QuarantineRun:
        """Moves every stored entry back; an original that exists again (triton rebuilt it) is kept and
        the stored copy stays in quarantine, reported as a conflict."""
        run = QuarantineRun(str(self.path / loaded.name))
        for entry in loaded.manifest.entries:
            run.outcomes.append(self._move_entry_back(loaded.fd, entry))
        self._remove_empty_folders(loaded.fd)
        if all(o.state in ("restored", "in-place") for o in run.outcomes):
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            with contextlib.suppress(OSError):  # only a marker: the next restore checks the entries again
                write_private_file(loaded.fd, RESTORED, json.dumps({"restored": stamp}).encode())
        return run

    def _move_entry_back(self, folder_fd: int, entry: ManifestEntry) -> EntryOutcome:
        original, stored = entry.below_root, entry.stored
        try:
            with _parent(folder_fd, stored, private=True) as source:
                if source is None or not exists_in(source, stored[-1]):
                    at_original = self._where(self.root_fd, original, False)
                    if at_original:
                        return EntryOutcome(entry.original, "in-place", "not in quarantine: never moved, or back")
                    return EntryOutcome(entry.original, "missing", "neither in quarantine nor at its place")
                with _made_parent(self.root_fd, original, create=0o777) as target:
                    if exists_in(target, original[-1]):
                        kept = "the original path exists again (rebuilt since); both kept"
                        return EntryOutcome(entry.original, "conflict", kept)
                    os.rename(stored[-1], original[-1], src_dir_fd=source, dst_dir_fd=target)
                    return self._compared(target, entry)
        except Untrusted as exc:
            return EntryOutcome(entry.original, "failed", f"not put back: {exc}")
        except OSError as exc:
            return EntryOutcome(entry.original, "failed", f"not put back: {refused_because(exc)}")

    @staticmethod
    def _compared(parent_fd: int, entry: ManifestEntry) -> EntryOutcome:
        """An entry just put back, file by file against its manifest."""
        try:
            same = inventory(parent_fd, entry.below_root[-1]) == sorted(entry.files, key=lambda r: r["path"])
        except OSError as exc:
            return EntryOutcome(entry.original, "changed", f"put back, but cannot be read to compare: {exc.strerror}")
        detail = "" if same else "put back, but its files differ from the manifest's sha256 and sizes"
        return EntryOutcome(entry.original, "restored" if same else "changed", detail)

    @staticmethod
    def _remove_empty_folders(folder_fd: int) -> None:
        """Only the folders a fix made to hold entries, once they hold nothing."""
        with contextlib.suppress(OSError):
            for _path, dirs, _files, fd in os.fwalk(ENTRIES, dir_fd=folder_fd, topdown=False, follow_symlinks=False):
                for name in dirs:
                    with contextlib.suppress(OSError):  # not empty: something is still in quarantine
                        os.rmdir(name, dir_fd=fd)
            os.rmdir(ENTRIES, dir_fd=folder_fd)
