"""Where the caches are, resolved as triton and torch resolve them (read from their sources).

- Triton: `TRITON_CACHE_DIR`, else `$TRITON_HOME/.triton/cache` (TRITON_HOME defaults to `~`).
- Inductor: `TORCHINDUCTOR_CACHE_DIR` (made absolute), else `<tempdir>/torchinductor_<user>`.
  A variable set to the empty string is set (triton 3.9 and torch read it so): the current folder.
  Under Inductor, Triton's kernels go to `<inductor>/triton/<device>` unless `TRITON_CACHE_DIR` is
  set; those folders are Triton roots of their own.
Neither library is imported: resolving a path must not start torch.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dflashdoctor.cache.model import RootKind


@dataclass(frozen=True)
class CacheRoot:
    kind: RootKind
    path: Path
    source: str
    relative: bool = False  # the configured path was relative: triton's group files break when cwd changes
    empty: bool = False  # the variable is set to "": torch and triton then cache in the current folder


def described(roots: list[CacheRoot]) -> str:
    """The roots as a report names its target: "kind path, ..."."""
    return ", ".join(f"{root.kind} {root.path}" for root in roots)


def absolute(path: str | os.PathLike[str]) -> Path:
    """An absolute path to the same folder. A `..` is resolved by the filesystem (links included), not
    by cutting the string, and only then: a root reached through a link keeps the path the user gave."""
    given = Path(path)
    return Path(os.path.realpath(given)) if ".." in given.parts else given.absolute()


def _user() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        name = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return re.sub(r'[\\/:*?"<>|]', "_", name)


def triton_root(env: Mapping[str, str]) -> CacheRoot:
    """A variable set to an empty value counts as set, as triton and torch read it: a relative path."""
    if "TRITON_CACHE_DIR" in env:
        raw = env["TRITON_CACHE_DIR"]
        return CacheRoot("triton", absolute(raw), "TRITON_CACHE_DIR", relative=not os.path.isabs(raw), empty=not raw)
    if "TRITON_HOME" in env:
        raw = os.path.join(env["TRITON_HOME"], ".triton", "cache")
        return CacheRoot("triton", absolute(raw), "TRITON_HOME", relative=not os.path.isabs(raw))
    return CacheRoot("triton", absolute(Path("~", ".triton", "cache").expanduser()), "default (~/.triton/cache)")


def inductor_root(env: Mapping[str, str]) -> CacheRoot:
    if "TORCHINDUCTOR_CACHE_DIR" in env:
        raw = env["TORCHINDUCTOR_CACHE_DIR"]
        relative = not os.path.isabs(raw)
        return CacheRoot("inductor", absolute(raw), "TORCHINDUCTOR_CACHE_DIR", relative=relative, empty=not raw)
    default = Path(tempfile.gettempdir(), f"torchinductor_{_user()}")
    return CacheRoot("inductor", default, "default (<tempdir>/torchinductor_<user>)")


def inductor_triton_roots(inductor: Path, source: str) -> list[CacheRoot]:
    """The per-device Triton folders inside an Inductor cache (used when TRITON_CACHE_DIR is unset)."""
    base = inductor / "triton"
    if not base.is_dir():
        return []
    return [
        CacheRoot("triton", child, f"{source}, device {child.name}")
        for child in sorted(base.iterdir())
        if child.is_dir() and not child.is_symlink() and not child.name.endswith(".dflashdoctor-quarantine")
    ]


def resolve_roots(
    env: Mapping[str, str], triton_dir: Path | None, inductor_dir: Path | None, all_roots: bool
) -> list[CacheRoot]:
    """The roots to check: the given ones, else the ones this environment uses (with `all_roots`, also
    the defaults the environment overrides), each once."""
    roots: list[CacheRoot] = []
    if triton_dir is not None:
        roots.append(CacheRoot("triton", absolute(triton_dir), "--triton-dir"))
    if inductor_dir is not None:
        roots.append(CacheRoot("inductor", absolute(inductor_dir), "--inductor-dir"))
    if not roots or all_roots:
        roots += [triton_root(env), inductor_root(env)]
        if all_roots:
            bare = {k: v for k, v in env.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
            roots += [triton_root(bare), inductor_root(bare)]
    for root in [r for r in roots if r.kind == "inductor"]:
        if "TRITON_CACHE_DIR" not in env or all_roots or root.source == "--inductor-dir":
            roots += inductor_triton_roots(root.path, f"inside {root.source}")
    unique: dict[Path, CacheRoot] = {}
    for root in roots:
        unique.setdefault(root.path, root)
    return list(unique.values())
