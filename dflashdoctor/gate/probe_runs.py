"""The gate's probes on one machine: each run as its own command would run it (`registry.PROBES`),
with the options the gate's configuration gives it, judged against the gate's budgets; at once by
default, forked from one probe host where they run here.

Each section says which timeout its probe ran with (`timeout_s`): the configuration's `timeout`
where set, else the probe's own default, which differs between probes (env's is short: it only
imports torch and reads versions). A cache check on this machine scans in the gate's own process and
has none."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from dflashdoctor.errors import MissingPackage
from dflashdoctor.forkserver.client import hosting
from dflashdoctor.gate.config import GateConfig, ProbeOptions
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.progress import Progress
from dflashdoctor.registry import PROBES
from dflashdoctor.report import Check, ProbeResult, Report
from dflashdoctor.runner import probe_env, probe_set, resolve_python
from dflashdoctor.session import new_report, run_probe_command


def _probe(name: str, config: GateConfig, python: str | None, ssh: str | None) -> Report:
    """One probe's own report, run as its command would run it, judged against the gate's budgets."""
    spec = PROBES[name]
    argv = ["dflashdoctor", "gate", name]
    options = config.probe_options(name, python, ssh)
    try:
        report = run_probe_command(spec, options, argv, config.budgets)
    except MissingPackage as exc:
        if exc.package not in spec.skipped_without:
            raise
        why = spec.skipped_without[exc.package]
        return _skipped(argv, name, f"{exc.package} is not installed in the probed interpreter: {why}")
    if _ran_a_process(spec, options):
        for result in report.results:
            result.measurements["timeout_s"] = options.timeout_s
    return report


def _ran_a_process(spec: ProbeSpec, options: ProbeOptions) -> bool:
    """Whether the probe ran in a process of its own, held to its timeout: a probe with a command of
    its own (cache) does its work in this process, and starts its script only on another machine."""
    return spec.command is None or options.ssh is not None


def _skipped(argv: list[str], probe: str, why: str) -> Report:
    """A section for a probe that does not apply here: shown, with why, and never a failure."""
    report = new_report("gate", argv)
    report.results.append(ProbeResult(probe=probe, status="skipped", checks=[Check(probe, "skip", why)]))
    return report


def told(progress: Progress | None, name: str, run: Callable[[], Report], gate_started: float) -> Report:
    """A probe's report, its start and end told to `progress`, and when it started after the gate
    did kept in its sections (the report's timeline draws what ran side by side)."""
    if progress is not None:
        progress.started(name)
    started_after = round(time.monotonic() - gate_started, 3)
    report = run()
    for result in report.results:
        result.measurements["started_after_s"] = started_after
    if progress is not None:
        progress.finished(name, report)
    return report


def probe_reports(
    config: GateConfig, python: str | None, ssh: str | None, progress: Progress | None, started: float
) -> tuple[list[Report], str | None]:
    """The probes at once, forked from one probe host where they run here (forkserver/): each then
    skips importing torch, dynamo and Inductor, which is most of a warm probe's CPU time. Also what
    the host did, for the report's environment."""
    forked = [name for name in config.probes if PROBES[name].forked_in_gate]
    interpreter = _local_python(python) if ssh is None and config.parallel and len(forked) > 1 else None
    # the probes compile for the device check-compile is given (the table's `device`, every probe's)
    device = config.check_compile.device
    host = hosting(interpreter, probe_env(interpreter), device) if interpreter else contextlib.nullcontext()
    workers = len(config.probes) if config.parallel else 1
    with probe_set() as running, host as opened, ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            futures = [
                pool.submit(
                    contextvars.copy_context().run,
                    told,
                    progress,
                    name,
                    partial(_probe, name, config, python, ssh),
                    started,
                )
                for name in config.probes
            ]
            reports = [future.result() for future in futures]
        except BaseException:
            # Stopped (SIGTERM, Ctrl-C), also before the last probe was asked for: the probes running in
            # the pool's threads, and those they start from now on, go too (the pool waits for them).
            if progress is not None:
                progress.interrupted()
            running.stop_all()
            raise
        return reports, opened.describe() if opened is not None else None


def _local_python(python: str | None) -> str | None:
    try:
        return resolve_python(python)
    except ValueError:  # the probes say so themselves, as bad input
        return None
