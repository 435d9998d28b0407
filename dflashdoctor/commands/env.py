"""`env`: versions, devices, cache roots, the knobs set, and known hazards, for bug reports and the gate."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflashdoctor.budgets import Budgets
from dflashdoctor.judges.env import judge
from dflashdoctor.observations import EnvObservations
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.report import Report
from dflashdoctor.session import finish, new_report, probe_into_report, probe_python

if TYPE_CHECKING:
    from dflashdoctor.gate.config import GateConfig


@dataclass
class EnvOptions:
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    timeout_s: float = 120.0


def env(options: EnvOptions, argv: list[str], budgets: Budgets | None = None) -> Report:
    started = time.monotonic()
    report = new_report("env", argv)
    python = probe_python(options.python, options.ssh)
    probe_into_report(
        report, SPEC, {}, python=python, timeout_s=options.timeout_s, budgets=budgets or Budgets(), ssh=options.ssh
    )
    return finish(report, started)


def from_gate(_config: GateConfig, python: str | None, ssh: str | None) -> EnvOptions:
    """env keeps its own short timeout in the gate too: it imports torch and reads versions."""
    return EnvOptions(python=python, ssh=ssh)


SPEC = ProbeSpec(
    name="env",
    options=EnvOptions,
    observations=EnvObservations,
    judge=judge,
    command=env,
    script="env.py",
    from_gate=from_gate,
    forked_in_gate=True,
)
