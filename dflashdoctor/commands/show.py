"""`show`: a saved report.json rendered again, in any format, without running anything (pyinstrument's
`--load` is the model): the report a CI job kept, read on a laptop; a JUnit or SARIF file made later
from an old run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dflashdoctor.errors import BadInput
from dflashdoctor.judges.plots import peak_plot
from dflashdoctor.judges.tables import call_site_charts, call_site_table, shape_subject
from dflashdoctor.observations import load
from dflashdoctor.placed_files import PlacedFileError, read_placed
from dflashdoctor.report import SCHEMA, Report
from dflashdoctor.shapes import AttentionShape

_MOST_BYTES = 256 * 2**20  # a report is kilobytes; a run's with many processes, a few megabytes
# Reports nest 11 deep (a finding's evidence in a section); every renderer walks a report recursively
# (dataclasses.asdict, the encodable copy, json.dumps), several frames a level: 900 levels, which
# json.loads reads, exhausted Python's 1000 frames (RecursionError: exit 3).
_MOST_DEPTH = 100


def load_report(path: Path) -> Report:
    """The report saved at `path`; anything else is bad input, said in one line."""
    try:
        if path.is_dir():
            raise BadInput(f"{path} is a folder: give its report.json")
        text = read_placed(path, _MOST_BYTES, follow=True).decode("utf-8")  # a FIFO or device is refused
    except PlacedFileError as exc:
        raise BadInput(f"{exc}: not a report dflashdoctor wrote") from None
    except FileNotFoundError:
        raise BadInput(f"no such report: {path}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text: not a report dflashdoctor wrote") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit number, or nesting 100,000 deep
        raise BadInput(f"{path} is not a report dflashdoctor wrote: {type(exc).__name__}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BadInput(f"{path} is not a dflashdoctor report (its schema is not {SCHEMA})")
    if _nesting(data) > _MOST_DEPTH:
        raise BadInput(f"{path} nests deeper than {_MOST_DEPTH} levels: not a report dflashdoctor wrote")
    try:
        report = Report.from_dict(data)
        _fill_earlier_sections(report, data["results"])
        durations = [report.duration_s, *(result.duration_s for result in report.results)]
        if not all(isinstance(d, int | float) and math.isfinite(d) for d in durations):
            raise ValueError("a duration is not a finite number of seconds")  # JUnit's time="nan" is no time
        return report
    except (TypeError, KeyError, ValueError, AttributeError, OverflowError) as exc:  # OverflowError: 1e400
        raise BadInput(f"{path} is a damaged {SCHEMA} document: {type(exc).__name__}: {exc}") from None


def _nesting(data: object) -> int:
    """How deep lists and objects nest in a JSON document, walked without recursion."""
    deepest, pending = 0, [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            pending += [(item, depth + 1) for item in (value.values() if isinstance(value, dict) else value)]
    return deepest


def _fill_earlier_sections(report: Report, sections: list[dict[str, Any]]) -> None:
    """A report written before sections carried their own tables, subject line, charts and links:
    each made from the measurements that version kept, so that it renders as a new one would."""
    env = report.environment
    for result, section in zip(report.results, sections, strict=True):
        sites, shape = result.measurements.get("call_sites"), result.measurements.get("shape")
        if "tables" not in section and sites:
            result.tables = [call_site_table(sites)]
        if "subject" not in section and shape:
            mask = str(result.measurements.get("mask") or "?")
            shape = load(AttentionShape, shape)  # as that version kept it: a key it added is no damage
            result.subject = shape_subject(env.get("device", "?"), env.get("device_name", "?"), shape, mask)
        if "plots" in section:  # written by a version that made its own charts and links
            continue
        if sites:
            for table in result.tables:
                if table.title == "call sites" and not table.row_sites and len(table.rows) == len(sites):
                    table.row_sites = call_site_table(sites).row_sites
            result.comparisons += call_site_charts(sites)
        result.plots = peak_plot(result.measurements.get("peak_bytes_by_step") or [])


def show(path: Path, format_name: str, *, verbose: bool) -> str:
    """The report at `path` in `format_name` ("terminal" or one of render.FORMATS), ready to print. A
    document that loads but cannot be rendered (a field of the wrong type) is damaged: bad input."""
    from rich.errors import NotRenderableError

    from dflashdoctor.render import FORMATS
    from dflashdoctor.render.terminal import render_terminal, terminal_console
    from dflashdoctor.safe_text import encodable_report

    if format_name != "terminal" and format_name not in FORMATS:
        raise BadInput(f"unknown format {format_name!r}; expected terminal or one of {', '.join(FORMATS)}")
    report = load_report(path)
    try:
        report = encodable_report(report)
        if format_name != "terminal":
            return FORMATS[format_name](report)
        console = terminal_console()
        with console.capture() as captured:
            render_terminal(report, console, verbose=verbose)
        return captured.get()
    except (TypeError, KeyError, ValueError, AttributeError, IndexError, OverflowError, NotRenderableError) as exc:
        # OverflowError: a number no renderer can format (a duration of 1e400, inf, or 10**400);
        # NotRenderableError: rich given a table's title or column that is not text
        raise BadInput(f"{path} is a damaged {SCHEMA} document: {type(exc).__name__}: {exc}") from None
