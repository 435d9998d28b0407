"""GitHub Actions: workflow commands that annotate files in the run's summary and in pull requests,
and the Markdown report appended to the job's step summary."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from dflashdoctor.render.common import repo_path
from dflashdoctor.render.markdown import render_markdown
from dflashdoctor.report import Report
from dflashdoctor.safe_text import without_controls

_COMMAND = {"error": "error", "warning": "warning", "info": "notice"}


def _escape(text: str, *, property_value: bool = False) -> str:
    """Workflow-command escaping: %, CR and LF always; `:` and `,` in property values too; no other
    control character reaches the log."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    text = without_controls(text)
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def workflow_commands(report: Report) -> list[str]:
    lines = []
    for result in report.results:
        for f in result.findings:
            props = [f"title={_escape(f.code, property_value=True)}"]
            if f.where and f.where.file and not f.where.file.startswith("<"):
                props.insert(0, f"file={_escape(repo_path(f.where.file), property_value=True)}")
                if f.where.line:
                    props.insert(1, f"line={f.where.line}")
                    if f.where.column:
                        props.insert(2, f"col={f.where.column}")
            lines.append(f"::{_COMMAND[f.severity]} {','.join(props)}::{_escape(f'{result.probe}: {f.title}')}")
    return lines


def publish(report: Report, environ: Mapping[str, str]) -> None:
    """Under GitHub Actions (GITHUB_ACTIONS=true): print the annotations, append the step summary."""
    if environ.get("GITHUB_ACTIONS") != "true":
        return
    for line in workflow_commands(report):
        print(line, flush=True)
    summary = environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as handle:
                handle.write(render_markdown(report) + "\n")
        except OSError as exc:  # the annotations are out; a missing summary must not fail the gate
            print(f"dflashdoctor: cannot append to GITHUB_STEP_SUMMARY {summary}: {exc.strerror}", file=sys.stderr)
