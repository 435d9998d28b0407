"""Is an installed package's compiled bytecode there, and can this interpreter write it?

Python compiles a module's source to bytecode on import and keeps it in `__pycache__`. Where no
current bytecode is there and none may be written (PYTHONDONTWRITEBYTECODE, `python -B`, a
read-only install), every process compiles torch, dynamo and Inductor from source again: on one
H200 node's image that made `import torch` plus dynamo and Inductor 9-15 s per process, against 6-7 s
once compiled (benchmarks/README.md), and a training job starts many (each rank, each Inductor
compile-worker pool). Standard library only: it runs on the probed side, before anything is imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

_HEADER_BYTES = 16
_HASH_BASED = 0b1


def _current(source: Path, compiled: Path) -> bool:
    """The bytecode the import system would accept: right magic, and (timestamp-based) made from
    this source's modification time and size; hash-based bytecode is taken as current."""
    try:
        with compiled.open("rb") as handle:
            header = handle.read(_HEADER_BYTES)
        stat = source.stat()
    except OSError:
        return False
    if len(header) < _HEADER_BYTES or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(header[4:8], "little") & _HASH_BASED:
        return True
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    return mtime == (int(stat.st_mtime) & 0xFFFFFFFF) and size == (stat.st_size & 0xFFFFFFFF)


def _bytecode_path(source: Path) -> Path | None:
    try:
        return Path(importlib.util.cache_from_source(str(source)))
    except NotImplementedError:  # an implementation with no bytecode cache (cache_tag is None)
        return None


def _writable(package_dir: Path) -> bool:
    """Whether importing would write the missing bytecode: allowed, and the folder it goes to (or
    the nearest existing folder above it) is writable."""
    if sys.dont_write_bytecode or sys.implementation.cache_tag is None:
        return False
    folder = Path(sys.pycache_prefix) if sys.pycache_prefix else package_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def package_bytecode(name: str) -> dict[str, Any] | None:
    """Modules of an importable package and how many have current bytecode; None where the package
    is not installed. Finding the package imports nothing (a top-level spec only)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        return None
    package_dir = Path(locations[0])
    modules = cached = 0
    for folder, dirs, names in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for source in (Path(folder, n) for n in names if n.endswith(".py")):
            modules += 1
            compiled = _bytecode_path(source)
            cached += compiled is not None and _current(source, compiled)
    return {
        "package": name,
        "path": str(package_dir),
        "modules": modules,
        "cached": cached,
        "writable": _writable(package_dir),
    }


def interpreter_bytecode() -> dict[str, Any]:
    """The interpreter's own settings that decide whether bytecode is written, and where."""
    return {
        "dont_write_bytecode": sys.dont_write_bytecode,
        "pycache_prefix": sys.pycache_prefix,
        "cache_tag": sys.implementation.cache_tag,
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
    }
