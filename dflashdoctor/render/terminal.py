"""The terminal view: reads like a doctor's verdict. One line per check, the verdict, then details."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dflashdoctor.causes import Cause, causes
from dflashdoctor.render.common import subject, verdict_line
from dflashdoctor.report import Report
from dflashdoctor.report import Table as ReportTable
from dflashdoctor.safe_text import with_strings, without_controls

_CHECK_STYLE = {
    "pass": ("✔", "green"),
    "fail": ("✘", "bold red"),
    "warn": ("!", "yellow"),
    "info": ("i", "cyan"),
    "skip": ("–", "dim"),
}
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "error": "bold magenta"}
_EVIDENCE_CHARS = 1200


def _one_line(text: str) -> str:
    """A title, a place, a detail, a fix, a check or a table cell is one line: a newline in it (a file
    name may hold one) is shown escaped, so that it cannot forge a line of the report; multi-line
    evidence (stacks, tracebacks) is shown with --verbose, dimmed."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


_PLACES_SHOWN = 8
_INDENT = "    "
_LOG_WIDTH = 240  # a CI log is not a terminal: its lines are not cut at 80 columns


def terminal_console(file: TextIO | None = None) -> Console:
    """The console a report is printed on: a terminal's own width; in a CI log or a file (not a
    TTY, no COLUMNS set) lines are not wrapped at all, so nothing is cut into 80-column pieces with
    trailing spaces."""
    stream = file if file is not None else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS"):
        return Console(file=file)
    return Console(file=file, width=_LOG_WIDTH, soft_wrap=True)


Label = tuple[str, str]  # words and their style


def _wrapped(
    console: Console,
    text: str,
    *,
    labels: tuple[Label, ...] = (),
    indent: str = _INDENT,
    hanging: str = _INDENT,
    style: str = "",
) -> None:
    """Labelled text (the labels coloured, at its start), its wrapped lines hanging at `hanging`
    (never back at column 0) and without trailing spaces; in a log (no wrapping) one line."""
    head = "".join(word for word, _ in labels)
    if console.soft_wrap:
        lines = [f"{indent}{head}{text}"]
    else:
        width = max(console.width - 1, len(hanging) + 20)
        lines = textwrap.wrap(head + text, width, initial_indent=indent, subsequent_indent=hanging)
    for i, line in enumerate(lines or [indent]):
        if i == 0 and labels and line.startswith(indent + head):
            console.print(Text.assemble(indent, *labels, line[len(indent) + len(head) :], style=style))
        else:
            console.print(Text(line, style=style))


def _cause_title(console: Console, cause: Cause) -> None:
    times = f"  ×{cause.count}" if cause.count > 1 else ""
    severity = (f"[{cause.severity}] ", _SEVERITY_STYLE[cause.severity])
    _wrapped(console, f"  {_one_line(cause.title)}{times}", labels=(severity, (cause.code, "bold")), indent="")


def _cause(console: Console, cause: Cause, verbose: bool) -> None:
    """One cause: its title (with how many places), where, the places when there are several, what
    the first says in detail, the fix once."""
    f = cause.first
    _cause_title(console, cause)
    if cause.count == 1 and "pid" in f.evidence:  # a finding of one process of a run
        rank = f.evidence.get("rank")
        _wrapped(console, f"in {'rank ' + str(rank) + ', ' if rank is not None else ''}pid {f.evidence['pid']}")
    if f.where:
        _wrapped(console, f"at {_one_line(f.where.label())}", style="dim")
    if cause.count > 1:
        shown = [_one_line(cause.place_label(place)) for place in cause.places[:_PLACES_SHOWN]]
        more = f" and {cause.count - _PLACES_SHOWN} more" if cause.count > _PLACES_SHOWN else ""
        _wrapped(console, "; ".join(shown) + more, labels=(("in: ", "bold"),))
    if f.detail:
        _wrapped(console, _one_line(f.detail))
    if f.fix:
        _wrapped(console, _one_line(f.fix), labels=(("fix: ", "green"),))
    if verbose and f.evidence:
        evidence = json.dumps(f.evidence, indent=2, default=str)
        console.print(Text(evidence[:_EVIDENCE_CHARS], style="dim"))


def _table(table: ReportTable) -> Table:
    """A section's table without its wide columns; the first column is the row's key, folded, never cut."""
    shown = [i for i, column in enumerate(table.columns) if column not in table.wide_columns]
    drawn = Table(box=None, padding=(0, 1), pad_edge=False)
    longest_key = max(len(row[0]) for row in table.rows)
    for i in shown:
        if i == 0:
            drawn.add_column(table.columns[0], min_width=min(longest_key, 36), overflow="fold")
        else:
            drawn.add_column(table.columns[i])
    for row in table.rows:
        drawn.add_row(*(Text(_one_line(row[i])) for i in shown))
    return drawn


def render_terminal(report: Report, console: Console, *, verbose: bool = False, report_dir: str | None = None) -> None:
    report = with_strings(report, without_controls)  # a message's escape sequences must not drive the terminal
    report_dir = without_controls(report_dir) if report_dir else report_dir
    _wrapped(console, f"  {subject(report)}", labels=(("dflashdoctor " + report.command, "bold"),), indent="")
    sections = len(report.results) > 1  # run: one section per process
    # the gate's passing sections in a line each (their checks with -v): a passing gate reads in a glance
    compact = report.command == "gate" and not verbose
    for result in report.results:
        shown = [c for c in result.checks if not compact or result.status != "pass" or c.status in ("fail", "warn")]
        if compact and result.status == "pass":
            mark, style = _CHECK_STYLE["pass"]
            quiet = len(result.checks) - len(shown)
            console.print(Text.assemble("  ", (mark, style), " ", (result.probe, "bold"), f"  pass · {quiet} checks"))
        elif sections or not result.checks or compact:
            console.print(f"  [bold]{escape(result.probe)}[/]: {result.status}")
        width = max((len(c.name) for c in shown), default=0)
        for check in shown:
            mark, style = _CHECK_STYLE[check.status]
            labels = ((mark, style), (" ", ""), (_one_line(check.name).ljust(width), "bold"), ("  ", ""))
            _wrapped(console, _one_line(check.summary), labels=labels, indent="  ", hanging=" " * (width + 6))
        for table in result.tables if not (compact and result.status == "pass") else ():
            if table.rows:
                console.print(Text(table.title, style="italic"))
                with console.capture() as drawn:  # rich pads every cell: lines end without spaces
                    console.print(_table(table))
                for line in drawn.get().splitlines():
                    row = Text.from_ansi(line)
                    row.rstrip()
                    console.print(row)
    console.print()
    console.print(Text(verdict_line(report), style=_VERDICT_STYLE[report.verdict]))
    grouped = causes(report)  # one entry per cause, the root cause first
    if grouped:
        console.print()
        for cause in grouped:
            if compact and cause.severity != "error":  # a passing gate's notes: their titles (-v: whole)
                times = f"  ×{cause.count}" if cause.count > 1 else ""
                severity = (f"[{cause.severity}] ", _SEVERITY_STYLE[cause.severity])
                _wrapped(
                    console, f"  {_one_line(cause.title)}{times}", labels=(severity, (cause.code, "bold")), indent=""
                )
                continue
            _cause(console, cause, verbose)
        if compact and any(cause.severity != "error" for cause in grouped):
            console.print(Text("(-v: every check, and each note in full)", style="dim"))
    if report_dir:
        others = "report.json, .md, .sarif, junit.xml"
        console.print(Text(f"\nreport: {report_dir}/report.html (also {others})", style="dim"))
