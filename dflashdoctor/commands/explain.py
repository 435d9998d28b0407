"""`explain [LOG ...]`: a crashed run's log (files, or `-` for stdin) diagnosed from its text: the
failure class (explain/classes.py), the call path split into the user's code, libraries and torch
(explain/call_path.py), which ranks failed, the command that confirms it on the user's pipeline and
the fix, worded once for `explain` and `run` (explain/diagnosis.py). One streamed pass, bounded memory
(explain/reader.py); nothing imported, no GPU. `--from-run DIR` reads instead the tracebacks a `run`
recorded whole in its report, each with its rank. Exit 1 when the text shows a failure, 0 when it
shows none, 2 for a file that cannot be read."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.commands.show import load_report
from dflashdoctor.errors import BadInput
from dflashdoctor.explain.classes import NEEDLES, SIGNALS
from dflashdoctor.explain.diagnosis import diagnose
from dflashdoctor.explain.reader import Reader, blocks
from dflashdoctor.placed_files import PlacedFileError, open_placed
from dflashdoctor.report import Check, ProbeResult, Report
from dflashdoctor.session import finish, new_report


@dataclass
class ExplainOptions:
    logs: list[str] = field(default_factory=lambda: ["-"])
    from_run: Path | None = None  # a `run` report folder: the tracebacks its processes recorded


def read_logs(logs: list[str], reader: Reader) -> None:
    """Every log in turn through one reader (a run's ranks may sit in several files)."""
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


# the commands whose report holds a run's recorded tracebacks: `run`, a gate that ran the training
# command, the merge of a run on several nodes
_WATCHED_A_RUN = ("run", "gate", "merge")


def read_run(folder: Path, reader: Reader) -> int:
    """The tracebacks a `run` recorded (each uncaught exception, whole, with its process's rank),
    read as that rank's lines; returns how many."""
    report = load_report(folder / "report.json" if folder.is_dir() else folder)
    if report.command not in _WATCHED_A_RUN:
        raise BadInput(f"{folder} holds a report of `{report.command}`, not of `run` (nor a gate or merge of one)")
    told = 0
    for result in report.results:
        for found in result.findings:
            evidence = found.evidence if isinstance(found.evidence, dict) else {}
            traceback, rank = evidence.get("traceback"), evidence.get("rank")
            if isinstance(traceback, str) and traceback:
                ranked = isinstance(rank, int) and not isinstance(rank, bool)
                reader.feed_text(traceback, rank if ranked else None)
                told += 1
    return told


def explain(options: ExplainOptions, argv: list[str]) -> Report:
    started = time.monotonic()
    report = new_report("explain", argv)
    reader = Reader(SIGNALS, NEEDLES)
    subject = ", ".join(options.logs)
    recorded = None
    if options.from_run is not None:
        recorded = read_run(options.from_run, reader)
        subject = f"the run reported in {options.from_run}"
    else:
        read_logs(options.logs, reader)
    diagnosis = diagnose(reader.finish())
    reading = diagnosis.reading
    result = ProbeResult(probe="explain", subject=subject)
    if diagnosis.found is None:
        read = f"{recorded} recorded tracebacks read" if recorded is not None else f"{reading.lines} lines read"
        result.checks.append(Check("failure", "pass", f"{read}: no failure in them"))
    else:
        result.findings = [diagnosis.finding()]
        result.checks.append(Check("failure", "fail", diagnosis.title, codes=[diagnosis.found.code]))
        if diagnosis.path.user_frame is not None:
            result.checks.append(Check("user frame", "info", diagnosis.path.user_frame.label()))
        ranks = reading.ranks_first_failure_first()
        if ranks:
            shown = ", ".join(map(str, ranks[:16])) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")
            root = " (torchrun's root cause first)" if reading.root_cause_rank is not None else ""
            result.checks.append(Check("ranks", "info", f"failed, first failure first: {shown}{root}"))
    result.measurements.update(
        lines=reading.lines,
        tracebacks=len(reading.tracebacks) + reading.dropped_tracebacks,
        ranks_failed=reading.ranks_first_failure_first(),
        seconds=round(time.monotonic() - started, 3),
    )
    report.results.append(result)
    return finish(report, started)


def log_paths(paths: list[Path] | None) -> list[str]:
    return [str(p) for p in paths] if paths else ["-"]
