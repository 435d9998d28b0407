"""Renderers: each turns one Report into one format and knows nothing of how it was collected.

`FORMATS` is the registry of the text formats (the terminal's is rich output, in terminal.py);
`FILES` names the file each one is written to in a report folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from dflashdoctor.render.html import render_html
from dflashdoctor.render.junit import render_junit
from dflashdoctor.render.markdown import render_markdown
from dflashdoctor.render.sarif import render_sarif
from dflashdoctor.report import Report
from dflashdoctor.report_folder import ReportFolder


def render_json(report: Report) -> str:
    return report.to_json()


class Renderer(Protocol):
    """A format: the whole report in, the document out. It may read any part of the Report (checks,
    findings, tables, comparisons, measurements as values) and nothing of the probe that made it."""

    def __call__(self, report: Report) -> str: ...


FORMATS: dict[str, Renderer] = {
    "json": render_json,
    "html": render_html,
    "md": render_markdown,
    "junit": render_junit,
    "sarif": render_sarif,
}
FILES = {"report.json": "json", "report.html": "html", "report.md": "md", "junit.xml": "junit", "report.sarif": "sarif"}


def write_report_dir(report: Report, directory: Path, observations: str | None = None) -> Path:
    """Write every file format into `directory` (created if needed), and `observations.json` when
    given (`Report.observations_json`), and the report's other files (`Report.files`); returns the
    directory. `report.json` comes last: a folder
    holding it is whole, which is how node 0 of a multi-node run knows another node's part is done.
    Each file replaces its name whole (report_folder.py), so a reader in another process sees the old
    file or the new one; observations.json, which holds environment values, is private to the user."""
    with ReportFolder.open(directory) as folder:
        if observations is not None:
            folder.write("observations.json", observations, private=True)
        for name, text in sorted(report.files.items()):
            folder.write(name, text)
        for name, format_name in sorted(FILES.items(), key=lambda item: item[0] == "report.json"):
            folder.write(name, FORMATS[format_name](report))
    return directory
