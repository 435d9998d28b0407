"""`env`: versions, devices, cache roots, the knobs set, and known hazards, for bug reports and the gate."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dflashdoctor.judges.env import EnvJudge
from dflashdoctor.report import ProbeResult, Report
from dflashdoctor.session import finish, new_report, probe_into_report, probe_python


@dataclass
class EnvOptions:
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    timeout_s: float = 120.0


def _judge(observations: dict[str, Any]) -> ProbeResult:
    return EnvJudge(observations).judge()


def env(options: EnvOptions, argv: list[str]) -> Report:
    started = time.monotonic()
    report = new_report("env", argv)
    python = probe_python(options.python, options.ssh)
    probe_into_report(report, "env", {}, python=python, timeout_s=options.timeout_s, judge=_judge, ssh=options.ssh)
    return finish(report, started)
