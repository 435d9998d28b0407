"""Whether a folder given as a cache root looks like one, before `cache fix` moves anything out of it.

A root set by mistake (`TORCHINDUCTOR_CACHE_DIR=` empty, which torch reads as the current folder, or
`--inductor-dir .` in a project) would have the scanners call a project's empty `__init__.py` or a
`.py` with a syntax error broken cache entries, and fix would move them out. Neither Inductor nor
Triton writes a project's files, nor a `.py` file at the top of its root (Inductor's generated code
lives in two-character shard folders; Triton's in key folders), so those mark a folder that is not
a cache: fix refuses it and moves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROJECT_MARKERS = frozenset(
    {
        *(".git", ".hg", ".svn", "pyproject.toml", "setup.py", "setup.cfg", "requirements.txt"),
        *("package.json", "Makefile", "__init__.py", "README.md", "README.rst", "LICENSE", ".gitignore"),
    }
)


def not_a_cache(root: Path) -> str | None:
    """Why `root` is not a cache root to repair, from its top level; None when nothing says so."""
    try:
        with os.scandir(root) as entries:
            names = [(entry.name, entry.is_file(follow_symlinks=False)) for entry in entries]
    except OSError:
        return None  # the scan said what it could not read
    marker = sorted(name for name, _ in names if name in _PROJECT_MARKERS)
    if marker:
        return f"it holds {marker[0]}: a project folder, not a cache (neither torch nor triton writes one)"
    top_code = sorted(name for name, is_file in names if is_file and name.endswith(".py"))
    if top_code:
        return f"it holds {top_code[0]} at its top: not a cache (generated code lives in shard or key folders)"
    return None
