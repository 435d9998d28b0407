"""Is an installed package's compiled bytecode there, and can this interpreter write it?

Python compiles a module's source to bytecode on import and keeps it in `__pycache__`. Where no
current bytecode is there and none may be written (PYTHONDONTWRITEBYTECODE, `python -B`, a
read-only install), every process compiles torch, dynamo and Inductor from source again: on one
H200 node's image that made `import torch` plus dynamo and Inductor 9-15 s per process, against 6-7 s
once compiled (benchmarks/README.md), and a training job starts many (each rank, each Inductor
compile-worker pool). Standard library only: it runs on the probed side, before anything is imported.

Where an image is so (PYTHONDONTWRITEBYTECODE set, its packages shipped without bytecode), the
doctor keeps bytecode of its own in a private cache of this user's instead, for its probes
(runner.bytecode_env) and for its own process (keep_own_bytecode), leaving the install untouched.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path
from typing import Any

_HEADER_BYTES = 16
_HASH_BASED = 0b1
# What a probe imports that is large enough for its bytecode to matter: torch is seconds, and
# Inductor's sympy and jinja2 most of one more. Any of them without bytecode is reason enough: with
# torch compiled but sympy not (compileall over torch alone), a warm gate on an H200 took 14.1 s
# against 10.5 s.
PROBE_PACKAGES = ("torch", "sympy", "jinja2", "networkx", "triton", "transformers", "fla")
# What the doctor's own process imports before it starts anything (0.4 s of an H200's warm gate)
DOCTOR_PACKAGES = ("dflashdoctor", "typer", "click", "rich")
# Set in a probe's environment where the doctor gave it the private cache: the user's own
# PYTHONDONTWRITEBYTECODE, so that `env` reports the interpreter as the user's processes have it.
GIVEN_VARIABLE = "DFLASHDOCTOR_BYTECODE_GIVEN"
_OWN_CHANGED: list[bool] = []  # set once keep_own_bytecode moved this process onto the private cache


def users_settings() -> tuple[bool, str | None, str | None]:
    """(dont_write_bytecode, pycache_prefix, PYTHONDONTWRITEBYTECODE) as the user's own processes
    have them, not as the doctor changed them for itself or its probes. It changes them only where
    bytecode may not be written and no prefix is set: then the user's are (True, None, the variable)."""
    if GIVEN_VARIABLE in os.environ:
        return True, None, os.environ[GIVEN_VARIABLE]
    if _OWN_CHANGED:
        return True, None, os.environ.get("PYTHONDONTWRITEBYTECODE")
    return sys.dont_write_bytecode, sys.pycache_prefix, os.environ.get("PYTHONDONTWRITEBYTECODE")


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
    """Where the user's processes read its bytecode. This process may read its own from the
    doctor's private cache, where the user's read theirs beside the source (`__pycache__`); the file
    name is the same either way. (No swapping of sys.pycache_prefix: the gate starts probes from
    several threads, and another thread's import would read or write in the wrong place.)"""
    try:
        compiled = Path(importlib.util.cache_from_source(str(source)))
    except NotImplementedError:  # an implementation with no bytecode cache (cache_tag is None)
        return None
    if sys.pycache_prefix and users_settings()[1] is None:
        return source.parent / "__pycache__" / compiled.name
    return compiled


def _writable(package_dir: Path) -> bool:
    """Whether importing would write the missing bytecode: allowed, and the folder it goes to (or
    the nearest existing folder above it) is writable."""
    dont_write, prefix, _ = users_settings()
    if dont_write or sys.implementation.cache_tag is None:
        return False
    folder = Path(prefix) if prefix else package_dir
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
    """The interpreter's own settings that decide whether bytecode is written, and where, as the
    user's processes have them."""
    dont_write, prefix, variable = users_settings()
    return {
        "dont_write_bytecode": dont_write,
        "pycache_prefix": prefix,
        "cache_tag": sys.implementation.cache_tag,
        "PYTHONDONTWRITEBYTECODE": variable,
    }


def _has_bytecode(package: str) -> bool:
    """Whether an installed package's `__init__` has its bytecode beside it; a package not
    installed has nothing to miss."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return True
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return True
    compiled = _bytecode_path(Path(spec.origin))
    return compiled is None or compiled.exists()


def private_pycache(packages: tuple[str, ...]) -> Path | None:
    """This user's private bytecode cache where it is wanted: bytecode may not be written here
    (PYTHONDONTWRITEBYTECODE, and no PYTHONPYCACHEPREFIX of the user's), one of `packages` has none,
    and the folder is this user's and closed to others (code from it is run). None otherwise."""
    if os.environ.get("PYTHONPYCACHEPREFIX") or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return None
    if GIVEN_VARIABLE in os.environ:  # a probe's own process: the doctor decided already
        return None
    if all(_has_bytecode(package) for package in packages):
        return None
    given = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(given) if os.path.isabs(given) else Path.home() / ".cache"  # a relative one is invalid (XDG)
    cache = root / "dflashdoctor" / "pycache"
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        return cache if _only_ours(root, [cache.parent, cache]) else None
    except OSError:
        return None


def _only_ours(root: Path, folders: list[Path]) -> bool:
    """No one else can put code where the cache is: its folders are real folders of this user's,
    closed to others, in a root that is this user's or root's and that others cannot rename them
    out of (not writable by others, or sticky as /tmp is)."""
    me = os.geteuid()
    info = root.stat()  # a root reached through a link (a ~/.cache on a scratch disk) is fine
    if info.st_uid not in (me, 0) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
        return False
    for folder in folders:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != me or info.st_mode & 0o022:
            return False
    return True


def keep_own_bytecode() -> None:
    """The doctor's own process, before it imports its CLI: under the same conditions as its probes,
    it reads and writes the bytecode of what it imports from here on in its private cache. Only the
    console entry calls this, never a process that imports dflashdoctor as a library."""
    cache = None if sys.pycache_prefix else private_pycache(DOCTOR_PACKAGES)  # `-X pycache_prefix`: the user's
    if cache is not None:
        _OWN_CHANGED.append(True)
        sys.pycache_prefix = str(cache)
        sys.dont_write_bytecode = False
