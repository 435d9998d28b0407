"""Moving broken entries aside, whole, and putting them back byte-identical. Nothing is deleted.

A fix writes its manifest first (every entry's original path, its files' sha256 and size, the
reason), atomically, and only then moves entries, each with one `os.rename` (atomic on one
filesystem; the quarantine sits beside the root for that reason). So the filesystem itself records
how far a fix got: an entry is moved exactly when its stored copy exists and its original does not.
A fix killed at any point is finished by the next `fix` and undone by `restore`, from the manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dflashdoctor.cache.model import Problem

SUFFIX = ".dflashdoctor-quarantine"
MANIFEST = "manifest.json"
RESTORED = "restored.json"
SCHEMA = "dflashdoctor.quarantine/1"
FIXABLE = ("corrupt", "incomplete", "orphan-tmp")  # stale entries are another triton's, not broken


def home_of(root: Path) -> Path:
    return root.parent / f"{root.name}{SUFFIX}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _inventory(path: Path) -> list[dict[str, Any]]:
    """Every file of an entry (a folder or one file): relative path, size, sha256; links by target."""
    if path.is_symlink() or path.is_file():
        paths = [path]
    else:
        paths = sorted(p for p in path.rglob("*") if p.is_symlink() or p.is_file())
    out = []
    for p in paths:
        rel = "." if p == path else str(p.relative_to(path))
        if p.is_symlink():
            out.append({"path": rel, "link": os.readlink(p)})
        else:
            out.append({"path": rel, "size": p.stat().st_size, "sha256": _sha256(p)})
    return out


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    descriptor = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _outermost(problems: list[Problem]) -> list[Problem]:
    """Entries to move: a temp folder inside a broken key folder moves with it, not on its own."""
    chosen: list[Problem] = []
    for problem in sorted(problems, key=lambda p: len(Path(p.entry).parts)):
        path = Path(problem.entry)
        if not any(path == Path(c.entry) or Path(c.entry) in path.parents for c in chosen):
            chosen.append(problem)
    return chosen


@dataclass
class EntryOutcome:
    original: str
    state: str  # moved, already-moved, failed, restored, missing, conflict, changed
    detail: str = ""


@dataclass
class QuarantineRun:
    folder: str
    outcomes: list[EntryOutcome] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "outcomes": [o.__dict__ for o in self.outcomes]}


def _state(entry: dict[str, Any], folder: Path) -> tuple[bool, bool]:
    original, stored = Path(entry["original"]), folder / entry["stored"]
    return os.path.lexists(original), os.path.lexists(stored)


def _move_all(folder: Path, manifest: dict[str, Any]) -> QuarantineRun:
    run = QuarantineRun(str(folder))
    for entry in manifest["entries"]:
        original, stored = Path(entry["original"]), folder / entry["stored"]
        at_original, at_stored = _state(entry, folder)
        if at_stored and not at_original:
            run.outcomes.append(EntryOutcome(entry["original"], "already-moved"))
            continue
        if not at_original:
            run.outcomes.append(EntryOutcome(entry["original"], "missing", "gone before it could be moved"))
            continue
        try:
            stored.parent.mkdir(parents=True, exist_ok=True)
            os.rename(original, stored)
        except OSError as exc:  # another filesystem, no permission: left where it is
            run.outcomes.append(EntryOutcome(entry["original"], "failed", f"not moved: {exc.strerror}"))
            continue
        run.outcomes.append(EntryOutcome(entry["original"], "moved", entry["reason"]))
    return run


def quarantine(root: Path, kind: str, problems: list[Problem]) -> QuarantineRun | None:
    """Moves each fixable problem's entry under a new quarantine folder beside `root`."""
    entries = _outermost([p for p in problems if p.kind in FIXABLE])
    if not entries:
        return None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = home_of(root) / stamp
    folder.mkdir(parents=True)
    manifest = {
        "schema": SCHEMA,
        "root": str(root),
        "kind": kind,
        "created": stamp,
        "entries": [
            {
                "original": p.entry,
                "stored": str(Path("entries") / Path(p.entry).relative_to(root)),
                "kind": p.kind,
                "reason": p.reason,
                "files": _inventory(Path(p.entry)),
            }
            for p in entries
        ],
    }
    _write_atomic(folder / MANIFEST, manifest)  # before any move: a kill after this loses nothing
    return _move_all(folder, manifest)


class ManifestError(ValueError):
    """A manifest that cannot be read back: the caller reports it, nothing is moved."""


def load_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is not a readable quarantine manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA or "entries" not in manifest:
        raise ManifestError(f"{path} is not a readable quarantine manifest (not {SCHEMA})")
    return manifest


def quarantines(root: Path) -> list[Path]:
    """This root's quarantine folders with a manifest, oldest first."""
    home = home_of(root)
    if not home.is_dir():
        return []
    return sorted(p for p in home.iterdir() if (p / MANIFEST).is_file())


def latest(root: Path) -> Path | None:
    """The newest quarantine of `root` not yet restored, else the newest."""
    found = quarantines(root)
    open_ones = [f for f in found if not (f / RESTORED).exists()]
    return (open_ones or found or [None])[-1]


def unfinished(root: Path) -> list[Path]:
    """Quarantines a killed fix left half-done: some entry still at its original place, not restored."""
    out = []
    for folder in quarantines(root):
        if (folder / RESTORED).exists():
            continue
        manifest = load_manifest(folder)
        if any(_state(e, folder) == (True, False) for e in manifest["entries"]):
            out.append(folder)
    return out


def resume(folder: Path) -> QuarantineRun:
    return _move_all(folder, load_manifest(folder))


def restore(folder: Path) -> QuarantineRun:
    """Moves every stored entry back; an original that exists again (triton rebuilt it) is kept and
    the stored copy stays in quarantine, reported as a conflict."""
    manifest = load_manifest(folder)
    run = QuarantineRun(str(folder))
    for entry in manifest["entries"]:
        original, stored = Path(entry["original"]), folder / entry["stored"]
        at_original, at_stored = _state(entry, folder)
        if not at_stored:
            state = "restored" if at_original else "missing"
            run.outcomes.append(EntryOutcome(entry["original"], state, "not in quarantine (never moved, or back)"))
            continue
        if at_original:
            kept = "the original path exists again (rebuilt since); both kept"
            run.outcomes.append(EntryOutcome(entry["original"], "conflict", kept))
            continue
        original.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stored, original)
        same = _inventory(original) == entry["files"]
        run.outcomes.append(EntryOutcome(entry["original"], "restored" if same else "changed", ""))
    _remove_empty_dirs(folder / "entries")
    if all(o.state == "restored" for o in run.outcomes):
        _write_atomic(folder / RESTORED, {"restored": datetime.now(UTC).isoformat(timespec="seconds")})
    return run


def _remove_empty_dirs(top: Path) -> None:
    """Only the folders a fix made to hold entries, once they hold nothing."""
    if not top.is_dir():
        return
    for parent, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):  # not empty: something is still in quarantine
            os.rmdir(parent)
