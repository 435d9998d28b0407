"""`gate`: env, check-compile, trace-attention, the race checks and cache check as one report, judged
against the configured budgets, and with `run` configured the team's own training command under
`run` (gate/run_smoke.py; on another node, there). Each probe's result is a section (a JUnit
testsuite, SARIF results).

The gate is a composition of the probe commands: its configuration is each probe's own Options
(gate/config.py, filled from the table by gate/table.py), each probe runs as its own command would
(`registry.PROBES`, gate/probe_runs.py), judged by its own judge with the team's budgets; the gate
only puts the sections together. It lives in gate/, above commands/: no command knows the gate.
The probes run at once by default (each is its own process; most of a probe's time is starting
Python and importing torch); `parallel = false` runs them one after another, for timings taken on
an otherwise idle machine (check-compile's compile and call times share the GPU and CPUs otherwise).

With several nodes (`--hostfile`, `--ssh` more than once) the gate runs so on each of them at once
and compares them (gate/nodes.py)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from dflashdoctor.errors import BadInput
from dflashdoctor.gate.code_trust import code_problem
from dflashdoctor.gate.config import GateConfig
from dflashdoctor.gate.config_file import load_config
from dflashdoctor.gate.hostfile import Node
from dflashdoctor.gate.merge import drop_repeated_findings
from dflashdoctor.gate.nodes import gate_nodes, nodes_report
from dflashdoctor.gate.probe_runs import probe_reports, told
from dflashdoctor.gate.run_smoke import remote_run_section, run_command, run_section, single_node_form
from dflashdoctor.gate.table import filled
from dflashdoctor.progress import Progress
from dflashdoctor.report import Report
from dflashdoctor.runs.launch import resolve_command
from dflashdoctor.session import finish, new_report, probe_python
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

    def overrides(self) -> dict[str, str]:
        """The configuration's keys the command line sets, as the table's own (gate/table.py): an
        empty --target or --device sets nothing."""
        given = {"target": self.target or None, "device": self.device or None, "run": self.run, "script": self.script}
        return {key: value for key, value in given.items() if value is not None}


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
    reports, host = probe_reports(config, python, ssh, progress, started)
    if host is not None:
        report.environment["probe_host"] = host
    if config.run is not None:  # after the probes: see gate/run_smoke.py
        command = single_node_form(run_command(config.run))  # each node runs the smoke on its own
        budgets = config.budgets
        if ssh is None:
            smoke = partial(run_section, command, config.run_steps, config.run_timeout, budgets, argv)
        else:
            remote = probe_python(python, ssh)
            smoke = partial(
                remote_run_section, command, config.run_steps, config.run_timeout, budgets, argv, ssh, remote
            )
        reports.append(told(progress, "run", smoke, started))
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
    config = filled(config, options.overrides(), "the command line")
    config.validate()  # the overrides too, whichever probes run, before any starts
    if config.run is not None:
        command = run_command(config.run)
        if not (options.ssh or options.nodes):
            resolve_command(command)  # a missing program is said now, not after the probes
    script = config.trace_attention.script
    if script is not None and not os.path.isfile(script):
        raise BadInput(f"script {script!r}: no such file (a Python file that runs one training step)")
    if not (options.ssh or options.nodes):  # on another node the files are that node's
        refused = code_problem(config, vouched, options.cwd)
        if refused:
            raise BadInput(refused)
    environment = {"target": config.check_compile.target, "gate_config": source.describe()}
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
