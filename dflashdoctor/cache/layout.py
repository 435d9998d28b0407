"""What Inductor and Triton write into a cache root, from their sources: whether a folder looks like
a cache root, and which paths in it are cache entries that `cache fix` may move.

A root set by mistake (`TORCHINDUCTOR_CACHE_DIR=` empty, which torch reads as the current folder, or
`--inductor-dir .` in a project) once had its empty `__init__.py` files and a draft with a syntax
error called broken entries and moved out. A list of what a project looks like always misses one, so
the rule is the other way round: what the two libraries write.

- Triton (triton/runtime/cache.py): `FileCacheManager` puts every file into `<root>/<key>/`, the key
  the base32 of a sha256 without padding (`_base32`, 52 of `A-Z2-7`), through a
  `tmp.pid_<pid>_<uuid>/` folder inside it. Nothing else at the top.
- Inductor (torch/_inductor/codecache.py `get_path`, `write`, `write_atomic`): generated code in
  `<root>/<key[1:3]>/<key>.<ext>`, the key a letter and 51 of lowercase base32 (cache_key.py), via a
  `.<pid>.<thread>.tmp` beside it; `fxgraph/<key[1:3]>/<key>/` (FxGraphCache) and `aotautograd/<key>/`
  (autograd_cache.py) one folder per entry. The other top-level names it writes are below. One
  kind is not written atomically: a C++ kernel's `<key>.so` / `.o` (CppCodeCache, `_worker_compile_cpp`)
  is the compiler's own output, written in place while torch holds `locks/<key>.lock`: empty, then
  partial, then whole (seen polling a CPU compile).

A folder whose top holds anything else is not a cache root: `fix` refuses it whole. In one that is,
`fix` moves only entries of the shapes above; whatever else is there stays where it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TRITON_KEY = re.compile(r"[A-Z2-7]{52}")  # each pattern here is used with fullmatch: `$` takes a "\n"
TRITON_TMP = re.compile(r"tmp\.pid_([0-9]+)_.*", re.DOTALL)
INDUCTOR_TMP = re.compile(r"\.([0-9]+)\.([0-9]+)\.tmp")
SHARD = re.compile(r"[a-z2-7]{2}")
_INDUCTOR_KEY = re.compile(r"[a-z][a-z2-7]{51}")
_GENERATED = re.compile(r"(?P<key>[a-z][a-z2-7]{51})(\.[A-Za-z0-9_]+)+")  # `<key>.py`, `<key>.main.cpp`, ...

# Every other name torch 2.13 writes at the top of its root (read from torch/_inductor and _dynamo).
_INDUCTOR_FOLDERS = frozenset(
    {
        *("fxgraph", "aotautograd", "locks", "triton"),  # codecache.py, autograd_cache.py, cache_dir_utils.py
        *("cache", "dynamo", "gcc", "precompiled_headers"),  # codecache.py, runtime/caching, _dynamo, cpp_builder
        *("aoti_eager", "autoheuristic", "bisect", "unhashed_kernel_inputs"),  # their modules; triton_heuristics
        *("torch_cutlass", "cutedsl_compile_cache"),  # codegen/cutlass/utils.py, runtime/cutedsl_cache.py
    }
)
_INDUCTOR_FILES = frozenset(
    {"memoizer_cache.json", "memoizer_cache.lock", "compiled_cache.db"}  # runtime/caching; cutlass's CACHE_FILE
)
_INDUCTOR_FOLDER_NAMES = re.compile(
    r"(halide-runtime-.+"  # codecache.py HalideCodeCache
    r"|tmp[a-z0-9_]{8})"  # utils.fresh_cache(dir=cache_dir()), mkdtemp: a whole cache of its own
)
_INDUCTOR_FILE_NAMES = re.compile(
    r"(tmp[a-z0-9_]{8}\.py"  # codegen/wrapper.py: autotuning code, when its log is at DEBUG
    r"|configs_.+\.json)"  # codegen/cutlass/cache.py
)


def _written_at_top(name: str, is_dir: bool) -> bool:
    """Whether Inductor or Triton writes `name` at the top of its root (as a folder or a file)."""
    if is_dir:
        shaped = TRITON_KEY.fullmatch(name) or SHARD.fullmatch(name) or _INDUCTOR_FOLDER_NAMES.fullmatch(name)
        return bool(shaped) or name in _INDUCTOR_FOLDERS
    return name in _INDUCTOR_FILES or bool(_INDUCTOR_FILE_NAMES.fullmatch(name))


def not_a_cache(root: Path) -> str | None:
    """Why `root` is not a cache root to repair: what its top holds that neither library writes.
    None for an empty root or one holding only what they write. Either kind's names are taken for
    either root: a root both variables name holds both."""
    try:
        with os.scandir(root) as entries:
            foreign = sorted(entry.name for entry in entries if not _written_at_top(entry.name, entry.is_dir()))
    except OSError:
        return None  # the scan said what it could not read
    if not foreign:
        return None
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    return f"its top holds {shown}, which neither Inductor nor Triton writes: not a cache root"


def is_cache_entry(kind: str, parts: tuple[str, ...]) -> bool:
    """Whether the path `parts` (below a root of `kind`) is a unit a fix may move: a Triton key folder
    or a temporary folder in one; an Inductor generated file in its shard, an fxgraph or aotautograd
    entry folder, or torch's temporary file in one of these. `kind` comes from a manifest too: any
    other kind has no entries."""
    if kind == "triton":
        if not parts or not TRITON_KEY.fullmatch(parts[0]):
            return False
        return len(parts) == 1 or (len(parts) == 2 and bool(TRITON_TMP.fullmatch(parts[1])))
    if kind != "inductor":
        return False
    if len(parts) == 2 and SHARD.fullmatch(parts[0]):
        generated = _GENERATED.fullmatch(parts[1])
        return bool(INDUCTOR_TMP.fullmatch(parts[1]) or (generated and generated["key"][1:3] == parts[0]))
    if parts[:1] == ("fxgraph",) and len(parts) >= 3:
        entry, rest = parts[1:3], parts[3:]
        shaped = bool(SHARD.fullmatch(entry[0]) and _INDUCTOR_KEY.fullmatch(entry[1]) and entry[1][1:3] == entry[0])
    elif parts[:1] == ("aotautograd",) and len(parts) >= 2:
        entry, rest = parts[1:2], parts[2:]
        shaped = bool(_INDUCTOR_KEY.fullmatch(entry[0]))
    else:
        return False
    return shaped and (not rest or (len(rest) == 1 and bool(INDUCTOR_TMP.fullmatch(rest[0]))))


def inductor_lock(root: str, path: str) -> str | None:
    """The lock torch holds while its compiler writes the generated file `path` in place
    (`<root>/locks/<key>.lock`, codecache's `get_lock_dir`); None for a file not of that shape."""
    generated = _GENERATED.fullmatch(os.path.basename(path))
    if generated is None or os.path.basename(os.path.dirname(path)) != generated["key"][1:3]:
        return None
    return os.path.join(root, "locks", generated["key"] + ".lock")


def written_by_a_cache(path: str) -> bool:
    """Whether a file path (as a traceback or an error prints it) has the shape of a file Inductor or
    Triton wrote into a cache: `<shard>/<key>.<ext>` with the shard the key's letters 1-2, or a file
    in a Triton `<key>/` folder; a bare `<key>.<ext>` (Python's SyntaxError names the file alone)."""
    parts = path.replace("\\", "/").split("/")
    generated = _GENERATED.fullmatch(parts[-1])
    if generated is not None:
        return len(parts) == 1 or generated["key"][1:3] == parts[-2]
    return len(parts) >= 2 and bool(TRITON_KEY.fullmatch(parts[-2]))


def cache_root_of(path: str) -> tuple[str, str] | None:
    """The kind and root of the cache a written file's path lies in (`inductor`: above its shard,
    `triton`: above its key folder); None for a bare name, a relative path (the part of a path with
    a space that a message shows) or another path."""
    parts = path.replace("\\", "/").split("/")
    if len(parts) < 4 or (parts[0] not in ("", "~") and not parts[0].endswith(":")) or not written_by_a_cache(path):
        return None
    kind = "inductor" if _GENERATED.fullmatch(parts[-1]) and SHARD.fullmatch(parts[-2]) else "triton"
    return kind, "/".join(parts[:-2]) or "/"
