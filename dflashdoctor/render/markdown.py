"""Markdown: for pull requests, issue comments and $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

import json

from dflashdoctor.render.common import (
    CHECK_MARKS,
    SITE_COLUMNS,
    format_value,
    scalar_measurements,
    site_rows,
    subject,
    verdict_line,
)
from dflashdoctor.report import Report


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report) -> str:
    lines = [f"# dflashdoctor {report.command}", "", f"`{subject(report)}`", "", f"**{verdict_line(report)}**", ""]
    for result in report.results:
        lines += [f"## {result.probe}: {result.status}", ""]
        if result.checks:
            lines += ["| check | result | summary |", "|---|---|---|"]
            lines += [f"| {_cell(c.name)} | {CHECK_MARKS[c.status]} | {_cell(c.summary)} |" for c in result.checks]
            lines.append("")
        rows = site_rows(result.measurements)
        if rows:
            lines += ["| " + " | ".join(SITE_COLUMNS) + " |", "|" + "---|" * len(SITE_COLUMNS)]
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
            lines.append("")
        for f in result.findings:
            lines += [f"### [{f.severity}] `{f.code}`: {f.title}", ""]
            if f.where:
                lines += [f"at `{f.where.label()}`", ""]
            if f.detail:
                lines += [f.detail, ""]
            if f.fix:
                lines += [f"**Fix:** {f.fix}", ""]
            if f.evidence:
                lines += [
                    "<details><summary>evidence</summary>",
                    "",
                    "```json",
                    json.dumps(f.evidence, indent=2, default=str),
                    "```",
                    "</details>",
                    "",
                ]
        scalars = scalar_measurements(result.measurements)
        if scalars:
            lines += ["| measurement | value |", "|---|---|"]
            lines += [f"| {_cell(k)} | {_cell(format_value(v))} |" for k, v in scalars.items()]
            lines.append("")
    return "\n".join(lines)
