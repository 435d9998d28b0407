"""Where a finished Report goes: the terminal or stdout as JSON, and the report directory."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console

from dflashdoctor.errors import BadInput
from dflashdoctor.render import write_report_dir
from dflashdoctor.render.junit import render_junit
from dflashdoctor.render.sarif import render_sarif
from dflashdoctor.render.terminal import render_terminal
from dflashdoctor.report import Report

DEFAULT_REPORTS = Path("reports")


def default_report_dir(command: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return DEFAULT_REPORTS / f"{stamp}-{command}"


def emit(report: Report, *, json_output: bool, report_dir: Path | None, verbose: bool) -> int:
    """Write the report directory, show the report, and return the exit code."""
    directory = write_report_dir(report, report_dir or default_report_dir(report.command))
    if json_output:
        sys.stdout.write(report.to_json() + "\n")
    else:
        render_terminal(report, Console(), verbose=verbose, report_dir=str(directory))
    return report.exit_code()


def write_extra_outputs(report: Report, *, junit: Path | None, sarif: Path | None) -> None:
    """Copies CI asks for at paths of its own (the report directory has every format already)."""
    for path, render in ((junit, render_junit), (sarif, render_sarif)):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(report), encoding="utf-8")
        except OSError as exc:  # the report directory is written already; say which copy failed
            raise BadInput(f"cannot write {path}: {exc.strerror}") from None
