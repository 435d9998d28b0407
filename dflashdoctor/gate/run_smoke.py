"""The gate's `run` section: the team's own training command under `run`'s agent, each process
stopped after a few optimizer steps, judged against the gate's budgets.

The probes predict; this sees. A dense backward reached only through the real training step, the
hidden flex path inside the team's model, two data-parallel pairs on threads entering one autotuner:
each is found where it happens. So a `concurrent-autotuner-entry` seen here is an error whatever
`threaded_autotuners` says (that budget excuses a prediction, not an observation); run's judge
never consults it.

It runs after the probes, not beside them. Beside them the gate would end sooner (measured on the
2-core CPU: docs/commands/gate.md), but the probes' figures would be taken with a trainer competing
for the same CPUs and GPU, and those figures are judged (check-compile's compile seconds against
`max_compile_seconds`). Its events go to a private temporary folder, removed after judging; what
the report needs is in the report.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path

from dflashdoctor.budgets import Budgets
from dflashdoctor.commands.run import RunOptions, run
from dflashdoctor.errors import BadInput
from dflashdoctor.report import Report


def run_command(spec: str | list[str]) -> list[str]:
    """The command as a list: a string is split as a shell would (quotes kept together); a list is
    taken as it is. Empty is bad input."""
    if isinstance(spec, str):
        try:
            words = shlex.split(spec)
        except ValueError as exc:  # an unclosed quote
            raise BadInput(f"run {spec!r} cannot be split as a shell would: {exc}") from None
    else:
        words = list(spec)
    if not words or any(not isinstance(word, str) or "\0" in word for word in words):
        raise BadInput("run must name a command: a string such as 'python train.py --max-steps 5', or a list of words")
    return words


def run_section(command: list[str], steps: int, timeout_s: float, budgets: Budgets, argv: list[str]) -> Report:
    """`run --steps STEPS` of the command, its stdout on stderr (the gate's stdout may be its JSON
    report), stopped with every thread's stack taken at `timeout_s` (`run-timeout`)."""
    folder = Path(tempfile.mkdtemp(prefix="dflashdoctor-gate-run-"))
    try:
        options = RunOptions(
            command=command,
            report_dir=folder,
            hang_timeout_s=timeout_s,
            deadline_s=timeout_s,
            steps=steps,
            stdout_to_stderr=True,
        )
        return run(options, argv, budgets)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
