"""`explain [LOG ...]`: a crashed run's log (files, or `-` for stdin) diagnosed from its text: the
failure class (explain/classes.py), the call path split into the user's code, libraries and torch
(explain/call_path.py), which ranks failed, the command that confirms it on the user's pipeline and
the fix. One streamed pass, bounded memory (explain/reader.py); nothing imported, no GPU. Exit 1
when the log shows a failure, 0 when it shows none, 2 for a file that cannot be read."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.codes import finding
from dflashdoctor.errors import BadInput
from dflashdoctor.explain.call_path import CallPath, call_path
from dflashdoctor.explain.classes import (
    NEEDLES,
    OTHER,
    SIGNALS,
    FailureClass,
    failing_traceback,
    failure_class,
    other_cause,
)
from dflashdoctor.explain.reader import Reader, Reading, blocks
from dflashdoctor.placed_files import PlacedFileError, open_placed
from dflashdoctor.report import Check, ProbeResult, Report, Where
from dflashdoctor.session import finish, new_report


@dataclass
class ExplainOptions:
    logs: list[str] = field(default_factory=lambda: ["-"])


def read_logs(logs: list[str]) -> Reading:
    """Every log in turn through one reader (a run's ranks may sit in several files)."""
    reader = Reader(SIGNALS, NEEDLES)
    for log in logs:
        if log == "-":
            reader.feed_blocks(blocks(sys.stdin.buffer))
            continue
        try:
            fd = open_placed(log, follow=True)
        except PlacedFileError as exc:
            raise BadInput(str(exc)) from None
        except OSError as exc:
            raise BadInput(f"cannot read {log}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as stream:
            reader.feed_blocks(blocks(stream))
    return reader.reading


def _confirm(found: FailureClass, path: CallPath) -> str:
    """The class's command with the log's own names where it has them."""
    frame = path.user_frame
    script = frame.path if frame is not None and frame.path.endswith(".py") else "YOUR_STEP.py"
    target = f"{frame.path}:{frame.function}" if frame is not None and frame.function != "?" else "MODULE:WRAPPER"
    return found.confirm.format(script=script, target=target)


def _finding(found: FailureClass, reading: Reading, path: CallPath) -> list:
    traceback = failing_traceback(reading)
    exception = traceback.exception if traceback and traceback.exception else ""
    if not exception and reading.exceptions:
        exception = reading.exceptions[-1][2]
    title = found.name if found is not OTHER else other_cause(reading)
    through = f"; through {path.library}'s own code" if path.library else ""
    where = None
    if path.user_frame is not None:
        where = Where(file=path.user_frame.path, line=path.user_frame.line, function=path.user_frame.function)
    detail = (f"The log's error: {exception.rstrip('.')}." if exception else "") + (
        f" The user's innermost frame is {path.user_frame.label()}{through}." if path.user_frame else through
    )
    evidence = {
        "signals": {name: [f"line {n}: {text}" for n, text in lines[:3]] for name, lines in reading.signals.items()},
        "ranks_failed": reading.failed_ranks,
        "call_path": [f"{who}: {frame.label()}" for who, frame in path.owners[-12:]],
        "library": path.library,
    }
    confirm = _confirm(found, path)
    fix = found.fix + (f" Confirm on your pipeline: `{confirm}`." if confirm else "")
    return [finding(found.code, title, detail=detail.strip(), where=where, evidence=evidence, fix=fix)]


def explain(options: ExplainOptions, argv: list[str]) -> Report:
    started = time.monotonic()
    report = new_report("explain", argv)
    reading = read_logs(options.logs)
    found = failure_class(reading)
    path = call_path(failing_traceback(reading))
    result = ProbeResult(probe="explain", subject=", ".join(options.logs))
    if found is None:
        result.checks.append(Check("failure", "pass", f"{reading.lines} lines read: no failure in the log"))
    else:
        result.findings = _finding(found, reading, path)
        ranks = f"; ranks that failed, first first: {reading.failed_ranks}" if reading.failed_ranks else ""
        result.checks.append(Check("failure", "fail", f"{found.name}{ranks}", codes=[found.code]))
        if path.user_frame is not None:
            result.checks.append(Check("user frame", "info", path.user_frame.label()))
    result.measurements.update(
        lines=reading.lines,
        tracebacks=len(reading.tracebacks) + reading.dropped_tracebacks,
        ranks_failed=reading.failed_ranks,
        seconds=round(time.monotonic() - started, 3),
    )
    report.results.append(result)
    return finish(report, started)


def log_paths(paths: list[Path] | None) -> list[str]:
    return [str(p) for p in paths] if paths else ["-"]
