"""`run -- CMD`: the user's own command under instrumentation, one report for all its processes."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.agent.config import RunSettings
from dflashdoctor.budgets import Budgets
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.run import judge
from dflashdoctor.limits import MAX_STEPS, count_problem
from dflashdoctor.observations import RunObservations
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.report import Report
from dflashdoctor.runs import launch
from dflashdoctor.runs.events import read_logs
from dflashdoctor.runs.watch import watch
from dflashdoctor.session import finish, new_report


@dataclass
class RunOptions:
    command: list[str] = field(default_factory=list)
    report_dir: Path = Path("reports/run")
    hang_timeout_s: float | None = 600.0
    steps: int | None = None
    memory_snapshot: bool = False
    strict: bool = False
    stdout_to_stderr: bool = False  # --json: the command's output must not mix with the report on stdout


def run(options: RunOptions, argv: list[str], budgets: Budgets | None = None) -> Report:
    command = launch.resolve_command(options.command)
    if options.steps is not None and count_problem(options.steps, "--steps", 1, MAX_STEPS):
        raise BadInput(count_problem(options.steps, "--steps", 1, MAX_STEPS))
    events = options.report_dir / "events"
    try:
        events.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create {events}: {exc.strerror}") from None
    if any(events.iterdir()):
        raise BadInput(f"{events} holds events of an earlier run: give another --report-dir")
    started = time.monotonic()
    report = new_report("run", argv)
    report.environment["target"] = " ".join(options.command)
    settings = RunSettings(steps=options.steps, memory_snapshot=options.memory_snapshot, strict=options.strict)
    bootstrap = launch.bootstrap_folder()
    try:
        environment = launch.child_environment(bootstrap, events, settings)
        child = launch.start(command, environment, stdout_to_stderr=options.stdout_to_stderr)
        outcome = watch(child, events, options.hang_timeout_s)
    finally:
        shutil.rmtree(bootstrap, ignore_errors=True)
    observations = RunObservations(command=options.command, outcome=outcome, processes=read_logs(events))
    report.observations["run"] = observations.to_dict()
    report.results.extend(judge(observations, budgets or Budgets()))
    instrumented = next((log.instrumented for log in observations.processes if log.instrumented), None)
    if instrumented:
        report.environment["torch"] = instrumented.get("torch")
    return finish(report, started)


SPEC = ProbeSpec(
    name="run",
    options=RunOptions,
    observations=RunObservations,
    judge=judge,
    command=run,
    script=None,  # the user's own command, with the agent (agent/) loaded into each of its processes
)
