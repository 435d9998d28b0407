"""`env`: versions, devices, cache roots, the knobs set, and known hazards, for bug reports and the gate."""

from __future__ import annotations

import time
from dataclasses import dataclass

from dflashdoctor.judges.env import EnvJudge
from dflashdoctor.report import Report
from dflashdoctor.session import finish, new_report, probe_into_report, probe_python


@dataclass
class EnvOptions:
    python: str | None = None
    timeout_s: float = 120.0


def env(options: EnvOptions, argv: list[str]) -> Report:
    started = time.monotonic()
    report = new_report("env", argv)
    python = probe_python(options.python)
    judge = lambda observations: EnvJudge(observations).judge()  # noqa: E731
    probe_into_report(report, "env", {}, python=python, timeout_s=options.timeout_s, judge=judge)
    return finish(report, started)
