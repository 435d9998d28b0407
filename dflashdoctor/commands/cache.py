"""`cache check|fix|restore`: scan the roots in this process (files only: nothing is imported,
executed or unpickled), then quarantine or restore, and judge."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.cache import quarantine as q
from dflashdoctor.cache.environment import inspect_root
from dflashdoctor.cache.inductor_scan import scan_inductor
from dflashdoctor.cache.model import RootScan
from dflashdoctor.cache.roots import CacheRoot, absolute, resolve_roots
from dflashdoctor.cache.safe_fs import Untrusted, refused_because
from dflashdoctor.cache.triton_scan import scan_triton
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.cache import judge
from dflashdoctor.limits import seconds_problem
from dflashdoctor.observations import CacheObservations
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.report import Report
from dflashdoctor.session import finish, new_report

if TYPE_CHECKING:
    from dflashdoctor.gate.config import GateConfig

ACTIONS = ("check", "fix", "restore")


@dataclass
class CacheOptions:
    action: str = "check"
    triton_dir: Path | None = None
    inductor_dir: Path | None = None
    all_roots: bool = False
    quarantine: Path | None = None  # restore: this quarantine folder (default: every open one of each root)
    wait_s: float = 300.0  # fix, restore: how long to wait for another run working on the same root


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


def _named_quarantine(folder: Path) -> tuple[Path, str]:
    """The root and the name of a quarantine folder the user named."""
    path = absolute(folder)
    if not os.path.lexists(path / q.MANIFEST):
        raise BadInput(f"{folder} is not a quarantine folder (no {q.MANIFEST} in it)")
    root = q.root_of(path.parent)
    if root is None:
        raise BadInput(f"{folder} is not a quarantine folder: it does not sit in a `<cache root>{q.SUFFIX}` folder")
    return root, path.name


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


def cache(options: CacheOptions, argv: list[str], budgets: Budgets | None = None) -> Report:
    try:
        return _cache(options, argv, budgets or Budgets())
    except q.ManifestError as exc:  # the quarantine the user named has no readable manifest
        raise BadInput(str(exc)) from None


def _cache(options: CacheOptions, argv: list[str], budgets: Budgets) -> Report:
    if options.action not in ACTIONS:
        raise BadInput(f"unknown cache action {options.action!r}; expected one of {', '.join(ACTIONS)}")
    for path, option in ((options.triton_dir, "--triton-dir"), (options.inductor_dir, "--inductor-dir")):
        if path is not None:
            _usable_dir(path, option)
    problem = seconds_problem(options.wait_s, "--wait", zero_means="does not wait")
    if problem:
        raise BadInput(problem)
    named = _named_quarantine(options.quarantine) if options.quarantine is not None else None
    started = time.monotonic()
    report = new_report("cache", argv)
    roots = resolve_roots(os.environ, options.triton_dir, options.inductor_dir, options.all_roots)
    report.environment.update(target=", ".join(f"{r.kind} {r.path}" for r in roots))
    triton_version = _installed_triton()
    report.environment["triton"] = triton_version
    log = q.RepairLog()
    scans: list[RootScan] = []
    facts: dict[str, dict[str, Any]] = {}
    if options.action == "restore":
        _restore(roots, named, options.wait_s, log)  # restored entries are the broken ones, knowingly: no scan
    else:
        for root in roots:
            scan, facts[str(root.path)] = _scan(root, triton_version)
            scans.append(scan)
        if options.action == "fix":
            _fix(roots, scans, facts, triton_version, options.wait_s, log)
    observations = CacheObservations(scans=scans, facts=facts, log=log)
    report.observations["cache"] = asdict(observations)
    report.results.extend(judge(observations, budgets))
    return finish(report, started)


def from_gate(config: GateConfig, _python: str | None, _ssh: str | None) -> CacheOptions:
    return CacheOptions(
        "check",
        Path(config.triton_dir) if config.triton_dir else None,
        Path(config.inductor_dir) if config.inductor_dir else None,
    )


SPEC = ProbeSpec(
    name="cache",
    options=CacheOptions,
    observations=CacheObservations,
    judge=judge,
    command=cache,
    script=None,
    from_gate=from_gate,
    local_only="run `dflashdoctor cache check` on that machine",
)


def _unusable(root: Path, exc: OSError | Untrusted, log: q.RepairLog, doing: str) -> None:
    """A quarantine folder that cannot be used: refused (not ours, loose, a link) or blocked."""
    if isinstance(exc, Untrusted):
        log.refusals.append(q.Refusal(exc.path, [exc.reason]))
        return
    where = f" ({exc.filename})" if isinstance(exc.filename, str) else ""
    log.blocked.append((str(root), str(q.home_of(root)), f"cannot be {doing}: {refused_because(exc)}{where}"))


def _open_home(root: Path, create: bool, log: q.RepairLog) -> q.QuarantineHome | None:
    """The root's quarantine folder, checked; None (and why, in the log) when it cannot be used."""
    try:
        return q.QuarantineHome.open(root, create=create)
    except (OSError, Untrusted) as exc:
        _unusable(root, exc, log, "made or opened")
    return None


def _locked(
    stack: contextlib.ExitStack, homes: list[q.QuarantineHome], wait_s: float, log: q.RepairLog
) -> list[q.QuarantineHome]:
    """Locks every home, in one order for every run (by the folder's identity, whatever path it was
    reached by), so that two runs over several roots cannot wait for each other. The homes locked."""
    locked = []
    for home in sorted(homes, key=lambda h: (os.fstat(h.fd).st_dev, os.fstat(h.fd).st_ino)):
        try:
            stack.enter_context(home.lock(wait_s))
        except (OSError, Untrusted) as exc:
            _unusable(home.root, exc, log, "locked")
            continue
        locked.append(home)
    return locked


def _fix(
    roots: list[CacheRoot],
    scans: list[RootScan],
    facts: dict[str, dict[str, Any]],
    triton_version: str | None,
    wait_s: float,
    log: q.RepairLog,
) -> None:
    """Under each root's lock: finish what a killed fix left, scan again (another fix may have moved
    entries since the first scan), and quarantine what is still broken."""
    with contextlib.ExitStack() as stack:
        work: list[tuple[int, q.QuarantineHome]] = []
        for index, (root, scan) in enumerate(zip(roots, scans, strict=True)):
            broken = any(p.kind in q.FIXABLE for p in scan.problems)
            if not broken and not os.path.lexists(q.home_of(root.path)):
                continue
            home = _open_home(root.path, broken, log)
            if home is not None:
                work.append((index, stack.enter_context(home)))
        locked = _locked(stack, [home for _, home in work], wait_s, log)
        for index, home in [(i, h) for i, h in work if h in locked]:
            runs = home.resume_unfinished(log.refusals)
            log.fixed += [(str(home.root), run) for run in runs]
            retried = {o.original for run in runs for o in run.outcomes if o.state == "failed"}  # in their manifest
            scans[index], facts[scans[index].path] = _scan(roots[index], triton_version)
            try:
                run = home.quarantine(scans[index].kind, [p for p in scans[index].problems if p.entry not in retried])
            except OSError as exc:  # no quarantine folder or manifest could be written: nothing was moved
                _unusable(home.root, exc, log, "written")
                continue
            if run is not None:
                log.fixed.append((str(home.root), run))


def _restore(roots: list[CacheRoot], named: tuple[Path, str] | None, wait_s: float, log: q.RepairLog) -> None:
    """Every quarantine not yet restored of each root, oldest first; or the one the user named."""
    targets = [named] if named is not None else [(root.path, None) for root in roots]
    with contextlib.ExitStack() as stack:
        work: list[tuple[q.QuarantineHome, str | None]] = []
        for root, only in targets:
            home = _open_home(root, False, log)
            if home is not None:
                work.append((stack.enter_context(home), only))
        locked = _locked(stack, [home for home, _ in work], wait_s, log)
        found = 0
        for home, only in [(h, o) for h, o in work if h in locked]:
            runs, refusals, count = home.restore(only)
            log.restored += runs
            log.refusals += refusals
            found += count
            if count and not runs and not refusals:
                log.all_restored.append(str(home.path))
    if not found and not log.refusals and not log.blocked:
        raise BadInput("no quarantine to restore beside " + ", ".join(str(root) for root, _ in targets))
