"""What a scan finds: problems (each one quarantinable unit) and per-root totals."""

from __future__ import annotations

import errno
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ProblemKind = Literal["corrupt", "incomplete", "orphan-tmp", "stale", "unreadable"]
RootKind = Literal["triton", "inductor"]


@dataclass
class Problem:
    kind: ProblemKind
    entry: str  # absolute path of the unit a fix moves whole: a key folder, a file, a temp folder
    reason: str
    files: list[str] = field(default_factory=list)  # the files the reason is about

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_failure(path: str, exc: OSError) -> Problem:
    """A file or folder the scan could not read: no permission is the owner's business (`fix` could
    not copy it either), anything else (a link loop, an I/O error) is damage."""
    denied = exc.errno in (errno.EACCES, errno.EPERM)
    where = exc.filename if isinstance(exc.filename, str) else path
    return Problem("unreadable" if denied else "corrupt", path, f"cannot be read: {exc.strerror} ({where})", [where])


@dataclass
class RootScan:
    kind: RootKind
    path: str
    source: str  # where the path came from: an environment variable, a default, --triton-dir, ...
    exists: bool = True
    entries: int = 0
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was seen and is healthy by design

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
