"""Markdown: for pull requests, issue comments and $GITHUB_STEP_SUMMARY. Every string from the report
goes through `markdown_text` or `markdown_code`, so a message holding HTML or backticks stays text."""

from __future__ import annotations

import json

from dflashdoctor.causes import causes
from dflashdoctor.render.common import (
    CHECK_MARKS,
    measurement_text,
    scalar_measurements,
    subject,
    summary_sentence,
    verdict_line,
)
from dflashdoctor.report import Report
from dflashdoctor.safe_text import markdown_block_fence, markdown_code, markdown_text


def _cell(text: str) -> str:
    return markdown_text(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report) -> str:
    lines = [
        f"# dflashdoctor {markdown_text(report.command)}",
        "",
        markdown_code(subject(report)),
        "",
        f"**{markdown_text(verdict_line(report))}**",
        "",
        markdown_text(summary_sentence(report)).replace("\n", " "),
        "",
    ]
    grouped = causes(report)
    if grouped:
        lines += ["## Causes", ""]
    for cause in grouped:  # each told once, with its places; the root cause first
        f = cause.first
        times = f" (×{cause.count})" if cause.count > 1 else ""
        lines += [
            f"### [{f.severity}] {markdown_code(f.code)}: {markdown_text(cause.title).replace(chr(10), ' ')}{times}",
            "",
        ]
        if f.where:
            lines += [f"at {markdown_code(f.where.label())}", ""]
        if cause.count > 1:
            lines += [f"- {markdown_text(cause.place_label(place))}" for place in cause.places] + [""]
        if f.detail:
            lines += [markdown_text(f.detail), ""]
        if f.fix:
            lines += [f"**Fix:** {markdown_text(f.fix)}", ""]
        if f.evidence:
            evidence = json.dumps(f.evidence, indent=2, default=str)
            fence = markdown_block_fence(evidence)
            lines += ["<details><summary>evidence</summary>", "", f"{fence}json", evidence, fence, "</details>", ""]
    for result in report.results:
        lines += [f"## {markdown_text(result.probe)}: {result.status}", ""]
        if result.checks:
            lines += ["| check | result | summary |", "|---|---|---|"]
            lines += [f"| {_cell(c.name)} | {CHECK_MARKS[c.status]} | {_cell(c.summary)} |" for c in result.checks]
            lines.append("")
        for table in result.tables:
            if table.rows:
                lines += ["| " + " | ".join(_cell(c) for c in table.columns) + " |", "|" + "---|" * len(table.columns)]
                lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
                lines.append("")
        scalars = scalar_measurements(result.measurements)
        if scalars:
            lines += ["| measurement | value |", "|---|---|"]
            lines += [f"| {_cell(k)} | {_cell(measurement_text(k, v))} |" for k, v in scalars.items()]
            lines.append("")
    return "\n".join(lines)
