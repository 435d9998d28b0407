"""Where a finished Report goes: the terminal or stdout as JSON, the report directory, and the copies
CI asks for. Every output starts from the report made encodable (safe_text.py)."""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from dflashdoctor import named_output
from dflashdoctor.errors import BadInput
from dflashdoctor.placed_files import kind_of
from dflashdoctor.render import github, write_report_dir
from dflashdoctor.render.junit import render_junit
from dflashdoctor.render.sarif import render_sarif
from dflashdoctor.render.terminal import render_terminal, terminal_console
from dflashdoctor.report import Report
from dflashdoctor.report_folder import ReportFolder, makeable_problem, unsafe_reason
from dflashdoctor.safe_text import encodable_report

DEFAULT_REPORTS = Path("reports")


def destination_problem(path: Path | None, *, folder: bool = True) -> str | None:
    """Why a report folder (or, with `folder=False`, a named copy of the report: named_output.py)
    could not be written at `path`, checked before any probe runs: minutes of probing must not end
    in a report that cannot be kept. The nearest part of the path that exists must be a folder this
    user can write, reached without following another user's link."""
    if not folder:
        return named_output.problem(path) if path is not None else None
    path = path if path is not None else DEFAULT_REPORTS
    if os.path.lexists(path):
        unsafe = _unsafe_folder(path)
        if unsafe:
            return unsafe
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{path} is {kind_of(os.stat(path).st_mode)}, not a folder"
    return makeable_problem(path)


def _unsafe_folder(path: Path) -> str | None:
    """A report folder that is a link or not safe to write into, said before any probe runs."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link: a report folder is never reached through one"
    reason = unsafe_reason(info) if stat.S_ISDIR(info.st_mode) else None
    return f"{path} is {reason}" if reason else None


def stdout_conflict(json_output: bool, **copies: Path | None) -> None:
    """Two documents on stdout (--json and `--sarif -`, or two copies sent there) would make neither
    readable: bad input, said before anything runs. `copies`: each option's value by its name."""
    said = [
        f"--{name} {path}" for name, path in copies.items() if path is not None and named_output.writes_stdout(path)
    ]
    said += ["--json"] if json_output else []
    if len(said) > 1:
        raise BadInput(f"{' and '.join(said)} would each write to stdout: send all but one elsewhere")


def new_report_dir(command: str) -> Path:
    """`reports/<time>-<command>`, made now (private) and never shared: a second run in the same
    second gets `-2`. `reports` itself is opened without following a link (report_folder.py)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    with ReportFolder.open(DEFAULT_REPORTS) as reports:
        for attempt in range(1, 10_000):
            name = f"{stamp}-{command}" if attempt == 1 else f"{stamp}-{command}-{attempt}"
            try:
                os.mkdir(name, 0o700, dir_fd=reports.fd)
            except FileExistsError:
                continue
            except OSError as exc:
                raise BadInput(f"cannot create the report folder {DEFAULT_REPORTS / name}: {exc.strerror}") from None
            return DEFAULT_REPORTS / name
    raise BadInput(f"no free report folder name under {DEFAULT_REPORTS} for {stamp}-{command}")


def emit(
    report: Report,
    *,
    json_output: bool,
    report_dir: Path | None,
    verbose: bool,
    junit: Path | None = None,
    sarif: Path | None = None,
    environ: Mapping[str, str] | None = None,
    text: Callable[[Report], str] | None = None,
) -> int:
    """Write the report directory (and the CI copies asked for), show the report, return the exit code.
    With `text` (lint's formats), that is what stdout shows, and the folder is written only where
    `report_dir` names one."""
    observations = report.observations_json()  # the probes' raw words, kept as they said them
    files = report.files  # beside the report, as made (a trace is JSON: encodable already)
    report = encodable_report(report)
    report.files = files
    if json_output:  # first: a report folder that fills up or is replaced mid-run cannot lose the report
        sys.stdout.write(report.to_json() + "\n")
        sys.stdout.flush()
    directory = report_dir if report_dir is not None or text is not None else new_report_dir(report.command)
    if directory is not None:
        try:
            write_report_dir(report, directory, observations)
        except OSError as exc:
            raise BadInput(f"cannot write the report to {directory}: {exc.strerror}") from None
    for path, render in ((junit, render_junit), (sarif, render_sarif)):
        if path is not None:
            _write_copy(path, render(report))
    on_stdout = any(path is not None and named_output.writes_stdout(path) for path in (junit, sarif))
    if not json_output and text is not None:
        (sys.stderr if on_stdout else sys.stdout).write(text(report))
    elif not json_output:  # beside a copy sent to stdout, the terminal's report goes to stderr
        console = terminal_console(sys.stderr) if on_stdout else terminal_console()
        render_terminal(report, console, verbose=verbose, report_dir=str(directory))
    if environ is not None:
        github.publish(report, environ)
    return report.exit_code()


def _write_copy(path: Path, text: str) -> None:
    try:
        named_output.write(path, text)
    except named_output.OutputRefused as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:  # the report directory is written already; say which copy failed
        if exc.errno in (errno.EPIPE, errno.ENOSPC, errno.EIO):
            raise
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
