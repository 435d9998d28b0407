"""`cache check|fix|restore`: scan the roots in this process (files only: nothing is imported,
executed or unpickled), then quarantine or restore, and judge. `cache check --ssh HOST` scans that
machine's roots there (probes/cache_check.py, the same scan); fix and restore change files, and only
on this machine."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.budgets import Budgets
from dflashdoctor.cache import quarantine as q
from dflashdoctor.cache.layout import not_a_cache
from dflashdoctor.cache.model import RootScan
from dflashdoctor.cache.observations import CacheObservations
from dflashdoctor.cache.repair_log import Refusal, RepairLog
from dflashdoctor.cache.roots import CacheRoot, absolute, described, resolve_roots
from dflashdoctor.cache.scan import installed_triton, named_roots_usable, scan_root, scan_roots
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.cache import judge
from dflashdoctor.limits import seconds_problem
from dflashdoctor.observations import dump
from dflashdoctor.options import cli, only_in
from dflashdoctor.probe_configs import CacheCheckConfig
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.records import RootFacts
from dflashdoctor.report import Report
from dflashdoctor.safe_fs import Untrusted, refused_because
from dflashdoctor.session import PROBE_TIMEOUT_S, finish, new_report, probe_into_report, probe_python

ACTIONS = ("check", "fix", "restore")


@dataclass
class CacheOptions:
    action: str = "check"  # the subcommand
    triton_dir: Path | None = field(default=None, metadata=cli("A Triton cache root (default: as triton resolves it)."))
    inductor_dir: Path | None = field(
        default=None, metadata=cli("An Inductor cache root (default: as torch resolves it).")
    )
    all_roots: bool = field(
        default=False, metadata=cli("Also the default roots the environment overrides, and their triton folders.")
    )
    quarantine: Path | None = field(
        default=None,
        metadata=cli(
            "A quarantine folder (default: every one of each root not yet restored, oldest first).", argument=True
        )
        | only_in("restore"),
    )
    wait_s: float = field(  # how long to wait for another run working on the same root
        default=300.0,
        metadata=cli(
            "Seconds to wait while another fix or restore holds a root's lock.", flag="--wait", seconds="does not wait"
        )
        | only_in("fix", "restore"),
    )
    python: str | None = field(default=None, metadata=only_in("check"))  # check --ssh: the interpreter there
    ssh: str | None = field(default=None, metadata=only_in("check"))  # check: scan that machine's roots, there
    # check --ssh: its probe there; here the scan is this process's own
    timeout_s: float = field(default=PROBE_TIMEOUT_S, metadata=only_in("check"))


def _named_quarantine(folder: Path) -> tuple[Path, str]:
    """The root and the name of a quarantine folder the user named."""
    path = absolute(folder)
    if not os.path.lexists(path / q.MANIFEST):
        raise BadInput(f"{folder} is not a quarantine folder (no {q.MANIFEST} in it)")
    root = q.root_of(path.parent)
    if root is None:
        raise BadInput(f"{folder} is not a quarantine folder: it does not sit in a `<cache root>{q.SUFFIX}` folder")
    return root, path.name


def cache(options: CacheOptions, argv: list[str], budgets: Budgets | None = None) -> Report:
    try:
        return _cache(options, argv, budgets or Budgets())
    except q.ManifestError as exc:  # the quarantine the user named has no readable manifest
        raise BadInput(str(exc)) from None


def _cache(options: CacheOptions, argv: list[str], budgets: Budgets) -> Report:
    if options.action not in ACTIONS:
        raise BadInput(f"unknown cache action {options.action!r}; expected one of {', '.join(ACTIONS)}")
    problem = seconds_problem(options.wait_s, "--wait", zero_means="does not wait")
    if problem:
        raise BadInput(problem)
    if options.ssh is not None:
        return _check_there(options, argv, budgets)
    named = _named_quarantine(options.quarantine) if options.quarantine is not None else None
    started = time.monotonic()
    report = new_report("cache", argv)
    log = RepairLog()
    scans: list[RootScan] = []
    facts: dict[str, RootFacts] = {}
    if options.action == "restore":
        named_roots_usable(options.triton_dir, options.inductor_dir)
        roots = resolve_roots(os.environ, options.triton_dir, options.inductor_dir, options.all_roots)
        _restore(roots, named, options.wait_s, log)  # restored entries are the broken ones, knowingly: no scan
    else:
        roots, scans, facts = scan_roots(os.environ, options.triton_dir, options.inductor_dir, options.all_roots)
        if options.action == "fix":
            _fix(roots, scans, facts, installed_triton(), options.wait_s, log)
    observations = CacheObservations(
        scans=scans, facts=facts, log=log, roots=described(roots), triton=installed_triton()
    )
    report.environment.update(target=observations.roots, triton=observations.triton)
    report.observations["cache"] = dump(observations)
    report.results.extend(judge(observations, budgets))
    return finish(report, started)


def _check_there(options: CacheOptions, argv: list[str], budgets: Budgets) -> Report:
    """`cache check` on another machine: its roots, scanned there, judged here."""
    if options.action != "check":
        raise BadInput(f"cache {options.action} changes files on this machine only: run it on {options.ssh} itself")
    started = time.monotonic()
    report = new_report("cache", argv)
    config = CacheCheckConfig(
        triton_dir=str(options.triton_dir) if options.triton_dir else None,
        inductor_dir=str(options.inductor_dir) if options.inductor_dir else None,
        all_roots=options.all_roots,
    )
    python = probe_python(options.python, options.ssh)
    probe_into_report(
        report, SPEC, config, python=python, timeout_s=options.timeout_s, budgets=budgets, ssh=options.ssh
    )
    payload = report.observations.get("cache") or {}
    report.environment.update(target=payload.get("roots", ""), triton=payload.get("triton"))
    return finish(report, started)


SPEC = ProbeSpec(
    name="cache",
    options=CacheOptions,
    observations=CacheObservations,
    judge=judge,
    command=cache,
    script="cache_check.py",  # --ssh; on this machine the command scans in its own process
    summary="Integrity of the Triton, Inductor and autotune caches: check, quarantine, restore.",
    subcommands={
        "check": "Find every broken, interrupted or stale entry, and hazards of where the caches live.",
        "fix": "Move each broken entry, whole, into a quarantine beside its root, with a manifest. Deletes nothing.",
        "restore": "Put quarantined entries back, byte-identical (checked against their manifests).",
    },
)


def _unusable(root: Path, exc: OSError | Untrusted, log: RepairLog, doing: str) -> None:
    """A quarantine folder that cannot be used: refused (not ours, loose, a link) or blocked."""
    if isinstance(exc, Untrusted):
        log.refusals.append(Refusal(exc.path, [exc.reason]))
        return
    where = f" ({exc.filename})" if isinstance(exc.filename, str) else ""
    log.blocked.append((str(root), str(q.home_of(root)), f"cannot be {doing}: {refused_because(exc)}{where}"))


def _open_home(root: Path, create: bool, log: RepairLog) -> q.QuarantineHome | None:
    """The root's quarantine folder, checked; None (and why, in the log) when it cannot be used."""
    try:
        return q.QuarantineHome.open(root, create=create)
    except (OSError, Untrusted) as exc:
        _unusable(root, exc, log, "made or opened")
    return None


def _locked(
    stack: contextlib.ExitStack, homes: list[q.QuarantineHome], wait_s: float, log: RepairLog
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
    facts: dict[str, RootFacts],
    triton_version: str | None,
    wait_s: float,
    log: RepairLog,
) -> None:
    """Under each root's lock: finish what a killed fix left, scan again (another fix may have moved
    entries since the first scan), and quarantine what is still broken."""
    with contextlib.ExitStack() as stack:
        work: list[tuple[int, q.QuarantineHome]] = []
        for index, (root, scan) in enumerate(zip(roots, scans, strict=True)):
            broken = any(p.kind in q.FIXABLE for p in scan.problems)
            if not broken and not os.path.lexists(q.home_of(root.path)):
                continue
            foreign = not_a_cache(root.path) or (f"{root.source} is set but empty" if root.empty else None)
            if foreign:  # a project's files are not cache entries: nothing is moved out of it
                log.refusals.append(Refusal(str(root.path), [foreign]))
                continue
            home = _open_home(root.path, broken, log)
            if home is not None:
                work.append((index, stack.enter_context(home)))
        locked = _locked(stack, [home for _, home in work], wait_s, log)
        for index, home in [(i, h) for i, h in work if h in locked]:
            runs = home.resume_unfinished(log.refusals)
            log.fixed += [(str(home.root), run) for run in runs]
            retried = {o.original for run in runs for o in run.outcomes if o.state == "failed"}  # in their manifest
            scans[index], found = scan_root(roots[index], triton_version)
            if found is not None:
                facts[scans[index].path] = found
            try:
                run = home.quarantine(scans[index].kind, [p for p in scans[index].problems if p.entry not in retried])
            except OSError as exc:  # no quarantine folder or manifest could be written: nothing was moved
                _unusable(home.root, exc, log, "written")
                continue
            if run is not None:
                log.fixed.append((str(home.root), run))


def _restore(roots: list[CacheRoot], named: tuple[Path, str] | None, wait_s: float, log: RepairLog) -> None:
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
