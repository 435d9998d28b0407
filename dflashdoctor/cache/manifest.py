"""The quarantine manifest: written by `fix` before anything moves, read back by `restore` and by
the next `fix`, and believed only as far as it is checked.

A manifest says where each entry came from (`original`, an absolute path under the root) and where
it sits in the quarantine (`stored`, relative, under `entries/`). Both become a sequence of plain
names (no `..`, no separators, nothing absolute) below a folder that is opened, not named, when a
move happens; an entry whose paths cannot be made so is refused, with the reason. Parsing takes any
JSON value and never raises anything but ManifestError.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from dflashdoctor.cache.inventory import FileRecord
from dflashdoctor.safe_fs import is_plain_name

SCHEMA = "dflashdoctor.quarantine/1"
MANIFEST = "manifest.json"
ENTRIES = "entries"  # the folder inside a quarantine that holds the moved entries
_SHOWN = 160  # characters of a hostile value quoted in a reason


class ManifestError(ValueError):
    """The manifest as a whole cannot be used: not JSON, not ours, or its root is unusable."""


@dataclass(frozen=True)
class ManifestEntry:
    index: int  # its place in the manifest, to name it by
    original: str  # as recorded, for the report
    below_root: tuple[str, ...]  # the original's names below the root
    stored: tuple[str, ...]  # names below the quarantine folder, the first being ENTRIES
    files: tuple[FileRecord, ...]
    reason: str = ""
    kind: str = ""


@dataclass
class Manifest:
    root: str
    kind: str
    entries: list[ManifestEntry] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)  # (index, why) of each entry not believed


def shown(value: Any) -> str:
    """A value from a manifest, quoted so control characters and odd code points stay visible."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _is_absolute_normal(path: object) -> TypeGuard[str]:
    return isinstance(path, str) and "\0" not in path and path.startswith("/") and os.path.normpath(path) == path


def _names_below(path: str, top: str) -> tuple[str, ...] | None:
    """`path`'s names below the folder `top` (both absolute), or None when it is not strictly below."""
    if not _is_absolute_normal(path):
        return None
    prefix = top if top.endswith("/") else top + "/"
    if not path.startswith(prefix):
        return None
    names = tuple(path[len(prefix) :].split("/"))
    return names if all(is_plain_name(n) for n in names) else None


def _stored_names(stored: Any) -> tuple[str, ...] | None:
    if not isinstance(stored, str) or stored.startswith("/"):
        return None
    names = tuple(stored.split("/"))
    if len(names) < 2 or names[0] != ENTRIES or not all(is_plain_name(n) for n in names):
        return None
    return names


def _is_file_record(record: Any) -> bool:
    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        return False
    if "link" in record:
        return isinstance(record["link"], str)
    size = record.get("size")
    return isinstance(size, int) and not isinstance(size, bool) and size >= 0 and isinstance(record.get("sha256"), str)


def _entry(index: int, raw: Any, root: str) -> ManifestEntry | str:
    """The entry, or why it is refused."""
    if not isinstance(raw, dict):
        return f"it is {type(raw).__name__}, not an object"
    original, stored, files = raw.get("original"), raw.get("stored"), raw.get("files")
    if not isinstance(original, str) or (below_root := _names_below(original, root)) is None:
        return f"original {shown(original)} is not a path inside the root {root}"
    stored_names = _stored_names(stored)
    if stored_names is None:
        return f"stored {shown(stored)} is not a path inside the quarantine's {ENTRIES}/"
    if not isinstance(files, list) or not all(_is_file_record(r) for r in files):
        return "files is not a list of file records (path with size and sha256, or link)"
    reason, kind = raw.get("reason", ""), raw.get("kind", "")
    if not isinstance(reason, str) or not isinstance(kind, str):
        return "reason and kind must be text"
    return ManifestEntry(index, original, below_root, stored_names, tuple(files), reason, kind)


def parse(data: Any) -> Manifest:
    """A manifest from its JSON value: the entries that can be believed, and why the others cannot."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ManifestError(f"not a {SCHEMA} manifest")
    root, entries, kind = data.get("root"), data.get("entries"), data.get("kind", "")
    if not _is_absolute_normal(root):
        raise ManifestError(f"its root {shown(root)} is not an absolute, normalised path")
    if not isinstance(entries, list):
        raise ManifestError("its entries are not a list")
    manifest = Manifest(root, kind if isinstance(kind, str) else "")
    for index, raw in enumerate(entries):
        parsed = _entry(index, raw, root)
        if isinstance(parsed, str):
            manifest.refused.append((index, parsed))
        else:
            manifest.entries.append(parsed)
    return manifest


def loads(raw: bytes) -> Manifest:
    try:
        return parse(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError(f"not readable JSON ({type(exc).__name__}: {shown(str(exc))})") from None


def build(root: str, kind: str, created: str, entries: list[ManifestEntry]) -> bytes:
    record = {
        "schema": SCHEMA,
        "root": root,
        "kind": kind,
        "created": created,
        "entries": [
            {
                "original": e.original,
                "stored": "/".join(e.stored),
                "kind": e.kind,
                "reason": e.reason,
                "files": list(e.files),
            }
            for e in entries
        ],
    }
    return json.dumps(record, indent=1).encode("utf-8")
