"""Scanning the cache roots of the machine this runs on: the part of `cache check` that reads files.

Shared by the doctor's own `cache` command and by the probe that scans another machine's roots
(`cache check --ssh`, the gate on another node), so both see a root the same way. Standard library
only: nothing is imported, executed or unpickled.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from dflashdoctor.cache.environment import inspect_root
from dflashdoctor.cache.inductor_scan import scan_inductor
from dflashdoctor.cache.model import RootScan
from dflashdoctor.cache.roots import CacheRoot, resolve_roots
from dflashdoctor.cache.triton_scan import scan_triton
from dflashdoctor.errors import BadInput
from dflashdoctor.records import RootFacts


def usable_dir(path: Path, option: str) -> None:
    """A root the user named must be a readable folder; a root found by default may be absent."""
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f"{option} {path}: a symbolic link loop") from None
        raise BadInput(f"{option} {path} does not exist") from None
    if not path.is_dir():
        raise BadInput(f"{option} {path} is a file, not a cache folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise BadInput(f"{option} {path} cannot be read by this user")


def named_roots_usable(triton_dir: Path | None, inductor_dir: Path | None) -> None:
    for path, option in ((triton_dir, "--triton-dir"), (inductor_dir, "--inductor-dir")):
        if path is not None:
            usable_dir(path, option)


def installed_triton() -> str | None:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def scan_root(root: CacheRoot, triton_version: str | None) -> tuple[RootScan, RootFacts | None]:
    """One root's entries and problems, and the facts of where it lives (filesystem, space, rights);
    a root not made yet has none."""
    if not root.path.is_dir():
        return RootScan(root.kind, str(root.path), root.source, exists=False), None
    if root.kind == "triton":
        scan = scan_triton(root.path, root.source, triton_version)
    else:
        scan = scan_inductor(root.path, root.source)
    return scan, inspect_root(root.path, os.environ, relative=root.relative, empty=root.empty, source=root.source)


def scan_roots(
    environ: Mapping[str, str], triton_dir: Path | None, inductor_dir: Path | None, all_roots: bool
) -> tuple[list[CacheRoot], list[RootScan], dict[str, RootFacts]]:
    """Every root this machine's environment points at (or the ones named), scanned; the facts of
    each root that exists, by its path."""
    named_roots_usable(triton_dir, inductor_dir)
    roots = resolve_roots(environ, triton_dir, inductor_dir, all_roots)
    triton_version = installed_triton()
    scans: list[RootScan] = []
    facts: dict[str, RootFacts] = {}
    for root in roots:
        scan, found = scan_root(root, triton_version)
        scans.append(scan)
        if found is not None:
            facts[scan.path] = found
    return roots, scans, facts
