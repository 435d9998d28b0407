"""`gate`: env, check-compile, trace-attention, the race checks and cache check as one report, judged
against the configured budgets, and with `run` configured the team's own training command under
`run` (gate/run_smoke.py; on another node, there). Each probe's result is a section (a JUnit testsuite, SARIF results).

Each probe runs as its own command would (`registry.PROBES`), judged by its own judge with the
team's budgets; the gate only puts the sections together. The probes run at once by default (each
is its own process; most of a probe's time is starting Python and importing torch);
`parallel = false` runs them one after another, for timings taken on an otherwise idle machine
(check-compile's compile and call times share the GPU and CPUs otherwise).

With several nodes (`--hostfile`, `--ssh` more than once) the gate runs so on each of them at once
and compares them (gate/nodes.py)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from dflashdoctor.errors import BadInput, MissingPackage
from dflashdoctor.forkserver.client import hosting
from dflashdoctor.gate.code_trust import code_problem
from dflashdoctor.gate.config import GateConfig, load_config
from dflashdoctor.gate.hostfile import Node
from dflashdoctor.gate.merge import drop_repeated_findings
from dflashdoctor.gate.nodes import gate_nodes, nodes_report
from dflashdoctor.gate.probe_options import OPTIONS_FROM_GATE
from dflashdoctor.gate.run_smoke import remote_run_section, run_command, run_section, single_node_form
from dflashdoctor.progress import Progress
from dflashdoctor.registry import PROBES
from dflashdoctor.report import Check, ProbeResult, Report
from dflashdoctor.runner import probe_env, probe_set, resolve_python
from dflashdoctor.runs.launch import resolve_command
from dflashdoctor.session import finish, new_report, probe_python, run_probe_command
from dflashdoctor.trust import Trust, trusting


@dataclass
class GateOptions:
    config: Path | None = None
    cwd: Path = Path(".")
    target: str | None = None  # overrides the configuration
    device: str | None = None
    run: str | None = None  # the team's training command (overrides the configuration's `run`)
    script: str | None = None  # trace-attention's step script (overrides the configuration's `script`)
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    nodes: list[Node] = field(default_factory=list)  # several: the gate on each, compared (hostfile, --ssh)
    trust: list[Path] = field(default_factory=list)  # --trust: run code from here whoever owns it (trust.py)


def _probe(name: str, config: GateConfig, python: str | None, ssh: str | None) -> Report:
    """One probe's own report, run as its command would run it, judged against the gate's budgets."""
    spec = PROBES[name]
    argv = ["dflashdoctor", "gate", name]
    try:
        return run_probe_command(spec, OPTIONS_FROM_GATE[name](config, python, ssh), argv, config.budgets())
    except MissingPackage as exc:
        if exc.package not in spec.skipped_without:
            raise
        why = spec.skipped_without[exc.package]
        return _skipped(argv, name, f"{exc.package} is not installed in the probed interpreter: {why}")


def _skipped(argv: list[str], probe: str, why: str) -> Report:
    """A section for a probe that does not apply here: shown, with why, and never a failure."""
    report = new_report("gate", argv)
    report.results.append(ProbeResult(probe=probe, status="skipped", checks=[Check(probe, "skip", why)]))
    return report


def _told(progress: Progress | None, name: str, run: Callable[[], Report], gate_started: float) -> Report:
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


def _probe_reports(
    config: GateConfig, python: str | None, ssh: str | None, progress: Progress | None, started: float
) -> tuple[list[Report], str | None]:
    """The probes at once, forked from one probe host where they run here (forkserver/): each then
    skips importing torch, dynamo and Inductor, which is most of a warm probe's CPU time. Also what
    the host did, for the report's environment."""
    forked = [name for name in config.probes if PROBES[name].forked_in_gate]
    interpreter = _local_python(python) if ssh is None and config.parallel and len(forked) > 1 else None
    host = hosting(interpreter, probe_env(interpreter), config.device) if interpreter else contextlib.nullcontext()
    workers = len(config.probes) if config.parallel else 1
    with probe_set() as running, host as opened, ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            futures = [
                pool.submit(
                    contextvars.copy_context().run,
                    _told,
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


def _gate_one(
    config: GateConfig,
    environment: dict[str, str],
    python: str | None,
    ssh: str | None,
    argv: list[str],
    progress: Progress | None = None,
) -> Report:
    """The gate on one machine: this one, or `ssh`; each probe's start and end told to `progress`."""
    started = time.monotonic()
    report = new_report("gate", argv)
    report.environment.update(environment)
    reports, host = _probe_reports(config, python, ssh, progress, started)
    if host is not None:
        report.environment["probe_host"] = host
    if config.run is not None:  # after the probes: see gate/run_smoke.py
        command = single_node_form(run_command(config.run))  # each node runs the smoke on its own
        budgets = config.budgets()
        if ssh is None:
            smoke = partial(run_section, command, config.run_steps, config.run_timeout, budgets, argv)
        else:
            remote = probe_python(python, ssh)
            smoke = partial(
                remote_run_section, command, config.run_steps, config.run_timeout, budgets, argv, ssh, remote
            )
        reports.append(_told(progress, "run", smoke, started))
    for sub in reports:
        report.results.extend(sub.results)
        report.observations.update(sub.observations)
        for key, value in sub.environment.items():
            report.environment.setdefault(key, value)
    drop_repeated_findings(report.results)
    return finish(report, started)


def gate(options: GateOptions, argv: list[str]) -> Report:
    vouched = Trust().with_paths(options.trust, Path.cwd())
    config, source = load_config(options.config, options.cwd, vouched)
    if source.path is not None:  # the configuration's own list, once the file itself has passed
        vouched = vouched.with_paths(config.trust, source.path.parent)
    if options.target:
        config.target = options.target
    if options.device:
        config.device = options.device
    if options.run is not None:
        config.run = options.run
    if options.script is not None:
        config.script = options.script
    config.validate()  # the overrides too, whichever probes run, before any starts
    if config.run is not None:
        command = run_command(config.run)
        if not (options.ssh or options.nodes):
            resolve_command(command)  # a missing program is said now, not after the probes
    if config.script is not None and not os.path.isfile(config.script):
        raise BadInput(f"script {config.script!r}: no such file (a Python file that runs one training step)")
    if not (options.ssh or options.nodes):  # on another node the files are that node's
        refused = code_problem(config, vouched, options.cwd)
        if refused:
            raise BadInput(refused)
    environment = {"target": config.target, "gate_config": source.describe()}
    if source.path is not None:  # where SARIF puts the gate's findings that have no line of their own
        environment["gate_config_path"] = str(source.path)
    if source.owner is not None:
        environment["gate_config_owner"] = source.owner
    with trusting(vouched):
        if not options.nodes:
            with Progress("gate") as progress:
                return _gate_one(config, environment, options.python, options.ssh, argv, progress)
        started = time.monotonic()
        outcomes = gate_nodes(
            options.nodes,
            lambda node: _gate_one(config, environment, node.python or options.python, node.spec, argv),
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            in_flight=config.nodes_in_flight,
        )
        return nodes_report(outcomes, argv, environment, started)
