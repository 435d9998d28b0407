"""`cache check|fix|restore`: scan the roots in this process (files only: nothing is imported,
executed or unpickled), then quarantine or restore, and judge."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from dflashdoctor.cache import quarantine as q
from dflashdoctor.cache.environment import inspect_root
from dflashdoctor.cache.inductor_scan import scan_inductor
from dflashdoctor.cache.model import RootScan
from dflashdoctor.cache.roots import CacheRoot, resolve_roots
from dflashdoctor.cache.triton_scan import scan_triton
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.cache import CacheJudge
from dflashdoctor.report import Report
from dflashdoctor.session import finish, new_report

ACTIONS = ("check", "fix", "restore")


@dataclass
class CacheOptions:
    action: str = "check"
    triton_dir: Path | None = None
    inductor_dir: Path | None = None
    all_roots: bool = False
    quarantine: Path | None = None  # restore: this quarantine folder (default: the latest of each root)


def _usable_dir(path: Path, option: str) -> None:
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


def _installed_triton() -> str | None:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def _scan(root: CacheRoot, triton_version: str | None) -> tuple[RootScan, dict[str, Any]]:
    if not root.path.is_dir():
        return RootScan(root.kind, str(root.path), root.source, exists=False), {}
    if root.kind == "triton":
        scan = scan_triton(root.path, root.source, triton_version)
    else:
        scan = scan_inductor(root.path, root.source)
    facts = inspect_root(root.path, os.environ) | {"relative": root.relative, "source": root.source}
    return scan, facts


def cache(options: CacheOptions, argv: list[str]) -> Report:
    try:
        return _cache(options, argv)
    except q.ManifestError as exc:  # a damaged manifest: say which, move nothing more
        raise BadInput(str(exc)) from None


def _cache(options: CacheOptions, argv: list[str]) -> Report:
    if options.action not in ACTIONS:
        raise BadInput(f"unknown cache action {options.action!r}; expected one of {', '.join(ACTIONS)}")
    for path, option in ((options.triton_dir, "--triton-dir"), (options.inductor_dir, "--inductor-dir")):
        if path is not None:
            _usable_dir(path, option)
    if options.quarantine is not None and not (options.quarantine / q.MANIFEST).is_file():
        raise BadInput(f"{options.quarantine} is not a quarantine folder (no {q.MANIFEST} in it)")
    started = time.monotonic()
    report = new_report("cache", argv)
    roots = resolve_roots(os.environ, options.triton_dir, options.inductor_dir, options.all_roots)
    report.environment.update(target=", ".join(f"{r.kind} {r.path}" for r in roots))
    restored = _restore(options, roots) if options.action == "restore" else []
    runs: list[tuple[str, q.QuarantineRun]] = []
    if options.action == "fix":
        for root in roots:
            runs += [(str(root.path), q.resume(folder)) for folder in q.unfinished(root.path)]
    scans, facts, triton_version = [], {}, _installed_triton()
    report.environment["triton"] = triton_version
    for root in roots if options.action != "restore" else []:  # restored entries are the broken ones, knowingly
        scan, root_facts = _scan(root, triton_version)
        scans.append(scan)
        facts[scan.path] = root_facts
    moved: set[str] = set()
    retried = {o.original for _, run in runs for o in run.outcomes if o.state == "failed"}  # in their manifest already
    if options.action == "fix":
        for scan in scans:
            run = q.quarantine(Path(scan.path), scan.kind, [p for p in scan.problems if p.entry not in retried])
            if run is not None:
                runs.append((scan.path, run))
                moved |= {o.original for o in run.outcomes if o.state == "moved"}
    report.results.append(CacheJudge(scans, facts, moved).judge(runs, restored))
    return finish(report, started)


def _restore(options: CacheOptions, roots: list[CacheRoot]) -> list[q.QuarantineRun]:
    if options.quarantine is not None:
        return [q.restore(options.quarantine)]
    folders = [q.latest(root.path) for root in roots if q.quarantines(root.path)]
    if not folders:
        raise BadInput("no quarantine to restore beside " + ", ".join(str(r.path) for r in roots))
    return [q.restore(folder) for folder in folders if folder is not None]
