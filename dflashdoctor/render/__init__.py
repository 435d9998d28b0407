"""Renderers: each turns one Report into one format and knows nothing of how it was collected."""

from __future__ import annotations

from pathlib import Path

from dflashdoctor.render.html import render_html
from dflashdoctor.render.junit import render_junit
from dflashdoctor.render.markdown import render_markdown
from dflashdoctor.render.sarif import render_sarif
from dflashdoctor.report import Report

FILES = {
    "report.json": lambda report: report.to_json(),
    "report.html": render_html,
    "report.md": render_markdown,
    "junit.xml": render_junit,
    "report.sarif": render_sarif,
}


def write_report_dir(report: Report, directory: Path) -> Path:
    """Write every file format into `directory` (created if needed); returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, render in FILES.items():
        (directory / name).write_text(render(report), encoding="utf-8")
    return directory
