"""The source files `lint` and `init` read: which ones (a walk that skips what no team writes) and
how (a regular file only, never blocking, never past a cap).

Kept lean because on a large tree the walk and the reads are most of what `init` costs: paths stay
strings (a `Path` per file, and `os.path.relpath`'s two `abspath` calls per file, cost more than
reading a small file), and a file is read with one `open`, one `fstat` and `read` calls on the
descriptor, with no buffered file object around it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

from dflashdoctor.lint.launches import document_kind
from dflashdoctor.placed_files import MIB, PlacedFileError, kind_of

SOURCE_BYTES = 4 * MIB  # a larger .py is generated data, not code anyone writes
# Folders no team's own code lives in: version control, caches, environments, build output.
SKIPPED = {".git", ".hg", "__pycache__", ".venv", "venv", ".tox", "node_modules", "build", "dist", ".mypy_cache"}
SKIPPED_SHELL = {".git", ".venv", "venv", "node_modules", "build", "dist"}  # documents may sit in the rest


def skipped(folder: str) -> bool:
    """A folder whose .py files are not the team's code."""
    return folder in SKIPPED or folder.endswith(".egg-info")


def read_source(path: str, max_bytes: int = SOURCE_BYTES, *, dir_fd: int | None = None) -> bytes:
    """The whole regular file at `path`, at most `max_bytes`: a link to one is followed, unless the
    file is named in an open folder (`dir_fd`: init's walk, which follows no link). A FIFO or a
    device is refused before any read (opened without blocking, so a FIFO with no writer never
    waits): PlacedFileError, an OSError, as for any file that cannot be read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if dir_fd is not None else 0)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise PlacedFileError(path, f"is {kind_of(status.st_mode)}, not a regular file")
        # ask for what fstat says is there, plus one byte to see a file that grew, never for the
        # cap: os.read allocates what it is asked for, and 4 MiB per file costs more than the read
        chunks, size, expected = [], 0, min(max_bytes, status.st_size) + 1
        while size <= max_bytes:
            chunk = os.read(fd, expected - size if expected > size else 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise PlacedFileError(path, f"is larger than {max_bytes // MIB} MiB: not a source file")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def tree_files(root_fd: int) -> Iterator[tuple[int, str, str, bool]]:
    """(its folder's descriptor, its name, its path relative to the root, whether it is Python) for
    each .py file lint reads and each document a launch command may be written in (README and
    other Markdown, shell and Slurm scripts, Makefiles, CI workflows, pyproject.toml:
    launches.document_kind) below the open folder `root_fd`, in one walk through descriptors (no
    path is looked up again, no link followed, so a folder swapped for a link while the walk runs
    leads nowhere), in a stable order (folders and files sorted, parents first). The descriptor is
    valid until the next item. Documents are also looked for in the folders skipped for Python
    (caches, tox environments, egg-info). A folder that cannot be read is passed over; OSError or
    RecursionError for a tree too deep to walk (one descriptor a level)."""
    python_skipped: set[str] = set()
    for folder, subfolders, files, folder_fd in os.fwalk(".", dir_fd=root_fd):
        relative = folder.removeprefix("./").removeprefix(".")
        skip_python = folder in python_skipped
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_SHELL)
        for name in subfolders:
            if skip_python or skipped(name):
                python_skipped.add(os.path.join(folder, name))
        for name in sorted(files):
            path = os.path.join(relative, name)
            python = name.endswith(".py")
            if (python and not skip_python) or document_kind(path) is not None or path == "pyproject.toml":
                yield folder_fd, name, path, python
