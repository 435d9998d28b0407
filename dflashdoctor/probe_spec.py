"""What defines a probe, in one record: its options (and so its defaults), what it observes, how it
is judged, the script the probed interpreter runs, and what it needs there.

Each command module declares its `SPEC`; `registry.PROBES` collects them. The CLI, the gate and the
runner read a probe from there. A probe whose work is all in its script needs no command function of
its own: `session.run_probe_command` runs any spec from its hooks (validate, the script's config,
the report's subject). The gate composes the probes' Options (`gate/config.py`) and sits above the
commands: no command knows the gate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.probe_configs import ProbeConfig
from dflashdoctor.report import ProbeResult, Report


def _no_problem(_options: Any) -> None:
    return None


def _no_subject(_options: Any) -> dict[str, str]:
    return {}


def _no_variables(_options: Any) -> dict[str, str]:
    return {}


def _default_budgets(_options: Any) -> Budgets:
    return Budgets()


@dataclass(frozen=True)
class ReportRequest:
    """What the command line asks of a report (--json, --report-dir, -v) and the words it was given."""

    json_output: bool
    report_dir: Path | None
    verbose: bool
    argv: list[str]


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    options: type  # the command's options dataclass: every default of the probe lives there
    observations: type  # what the probe reports (observations.py), loaded before judging
    judge: Callable[[Any, Budgets], list[ProbeResult]]
    script: str | None  # probes/<script> in the probed interpreter; None: the doctor's side does the work
    summary: str = ""  # what it answers, in one line: its command's help (cli_options.probe_command)
    # The options as the probe's script reads them (probe_configs.py). None: the probe has its own `command`.
    probe_config: Callable[[Any], ProbeConfig] | None = None
    # Bad input said before a probe starts (raises BadInput); the probe checks the rest.
    validate: Callable[[Any], None] = _no_problem
    # What the report says it looked at (`target`, `requested_device`, ...), from the options.
    subject: Callable[[Any], dict[str, str]] = _no_subject
    # Environment variables the script needs set before it starts.
    variables: Callable[[Any], dict[str, str]] = _no_variables
    # The budgets when the command runs alone (the gate passes its own).
    budgets: Callable[[Any], Budgets] = _default_budgets
    # options, argv, budgets -> the probe's own report; None: session.run_probe_command
    command: Callable[[Any, list[str], Budgets | None], Report] | None = None
    # packages whose absence there means the probe does not apply, and why
    skipped_without: dict[str, str] = field(default_factory=dict)
    # Subcommands (name -> their help), each made from the Options with its name in their `action`:
    # cache's check, fix and restore. None: the probe is one command.
    subcommands: dict[str, str] = field(default_factory=dict)
    # A doctor-side probe that puts its report where it decides (run: its folder, its node's part of
    # a run on several, the merge) gets the command line's wishes and returns the exit code. None:
    # the report goes where the command line says, as every probe's does.
    own_output: Callable[[Any, ReportRequest], int] | None = None
    # run here by the gate, it is forked from the probe host (forkserver/): it imports torch, and sets
    # no environment variable that torch or triton would read at import (server.READ_WHEN_USED)
    forked_in_gate: bool = False
