"""lint's findings as a linter prints them (`--output-format`): `concise`, one line each
(`path:line:col: DFD001 message`, the form editors and CI logs link); `full`, that line with the
detail and the fix below it; `json`, one array of objects; `github`, workflow commands that annotate
the pull request's lines; `sarif`, SARIF 2.1.0. Every string is printed with its control characters
escaped (a file name can hold any byte but `/` and NUL)."""

from __future__ import annotations

import json
from typing import Any

from dflashdoctor.lint.settings import SHORT_CODES
from dflashdoctor.render.github import workflow_commands
from dflashdoctor.render.sarif import render_sarif
from dflashdoctor.report import Finding, Report
from dflashdoctor.safe_text import encodable, without_controls

FORMATS = ("concise", "full", "json", "github", "sarif")


def _text(value: str) -> str:
    """One line: a newline or tab in a file name is escaped, as every other control character is."""
    one_line = encodable(value).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return without_controls(one_line)


def _findings(report: Report) -> list[Finding]:
    return [f for result in report.results for f in result.findings]


def _place(f: Finding) -> str:
    where = f.where
    if where is None:
        return "?"
    return f"{_text(where.file or '?')}:{where.line or 1}:{where.column or 1}"


def _line(f: Finding) -> str:
    return f"{_place(f)}: {SHORT_CODES.get(f.code, f.code)} {_text(f.title)}"


def _summary(report: Report, count: int) -> str:
    measured = report.results[0].measurements if report.results else {}
    files = measured.get("files", 0)
    read = f"{files} file{'s' if files != 1 else ''}"
    if count == 0:
        return f"All checks passed ({read} read)."
    return f"Found {count} finding{'s' if count != 1 else ''} ({read} read)."


def concise(report: Report) -> str:
    found = _findings(report)
    return "".join(_line(f) + "\n" for f in found) + _summary(report, len(found)) + "\n"


def full(report: Report) -> str:
    lines = []
    for f in _findings(report):
        lines.append(_line(f))
        if f.detail:
            lines.append(f"    {_text(f.detail)}")
        if f.fix:
            lines.append(f"    fix: {_text(f.fix)}")
        lines.append("")
    return "\n".join(lines) + _summary(report, len(_findings(report))) + "\n"


def _record(f: Finding) -> dict[str, Any]:
    where = f.where
    return {
        "code": SHORT_CODES.get(f.code, f.code),
        "name": f.code,
        "severity": f.severity,
        "message": encodable(f.title),
        "filename": encodable(where.file or "") if where else None,
        "location": {"row": where.line, "column": where.column or 1} if where and where.line else None,
        "function": encodable(where.function) if where and where.function else None,
        "detail": encodable(f.detail),
        "fix": encodable(f.fix),
    }


def as_json(report: Report) -> str:
    return json.dumps([_record(f) for f in _findings(report)], indent=2) + "\n"


def github(report: Report) -> str:
    return "".join(line + "\n" for line in workflow_commands(report))


def render(report: Report, output_format: str) -> str:
    return {"concise": concise, "full": full, "json": as_json, "github": github, "sarif": render_sarif}[output_format](
        report
    )
