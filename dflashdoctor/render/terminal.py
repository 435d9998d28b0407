"""The terminal view: reads like a doctor's verdict. One line per check, the verdict, then details."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dflashdoctor.render.common import subject, verdict_line
from dflashdoctor.report import Finding, Report
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


def _finding(console: Console, f: Finding, verbose: bool) -> None:
    title = _one_line(f.title)
    console.print(Text.assemble((f"[{f.severity}] ", _SEVERITY_STYLE[f.severity]), (f.code, "bold"), "  ", title))
    if "pid" in f.evidence:  # a finding of one process of a run
        rank = f.evidence.get("rank")
        console.print(Text(f"    in {'rank ' + str(rank) + ', ' if rank is not None else ''}pid {f.evidence['pid']}"))
    if f.where:
        console.print(Text(f"    at {_one_line(f.where.label())}", style="dim"))
    if f.detail:
        console.print(Text("    " + _one_line(f.detail)))
    if f.fix:
        console.print(Text.assemble(("    fix: ", "green"), _one_line(f.fix)))
    if verbose and f.evidence:
        evidence = json.dumps(f.evidence, indent=2, default=str)
        console.print(Text(evidence[:_EVIDENCE_CHARS], style="dim"))


def _table(table: ReportTable) -> Table:
    """A section's table without its wide columns; the first column is the row's key, folded, never cut."""
    shown = [i for i, column in enumerate(table.columns) if column not in table.wide_columns]
    drawn = Table(title=table.title, title_justify="left", box=None, padding=(0, 1))
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
    console.print(Text.assemble(("dflashdoctor " + report.command, "bold"), "  ", subject(report)))
    sections = len(report.results) > 1  # run: one section per process
    for result in report.results:
        if sections or not result.checks:
            console.print(f"  [bold]{escape(result.probe)}[/]: {result.status}")
        width = max((len(c.name) for c in result.checks), default=0)
        for check in result.checks:
            mark, style = _CHECK_STYLE[check.status]
            console.print(
                Text.assemble(
                    "  ",
                    (mark, style),
                    " ",
                    (_one_line(check.name).ljust(width), "bold"),
                    "  ",
                    _one_line(check.summary),
                )
            )
        for table in result.tables:
            if table.rows:
                console.print(_table(table))
    console.print()
    console.print(Text(verdict_line(report), style=_VERDICT_STYLE[report.verdict]))
    findings = sorted(report.findings(), key=lambda f: ("error", "warning", "info").index(f.severity))
    if findings:
        console.print()
        for f in findings:
            _finding(console, f, verbose)
    if report_dir:
        others = "report.json, .md, .sarif, junit.xml"
        console.print(Text(f"\nreport: {report_dir}/report.html (also {others})", style="dim"))
