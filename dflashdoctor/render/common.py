"""Small wording helpers shared by the renderers, so every format says the same thing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashdoctor.causes import causes
from dflashdoctor.render.svg import human
from dflashdoctor.report import Report

CHECK_MARKS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "info": "INFO", "skip": "SKIP"}


def subject(report: Report) -> str:
    """One line naming what was examined: the target, each section's subject, torch."""
    env = report.environment
    parts = [env.get("target", ""), *(result.subject for result in report.results)]
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    return " · ".join(p for p in parts if p)


def counts(report: Report) -> dict[str, int]:
    """Causes by severity (a cause told at five places counts once)."""
    tally = {"error": 0, "warning": 0, "info": 0}
    for cause in causes(report):
        tally[cause.severity] += 1
    return tally


def verdict_line(report: Report) -> str:
    tally = counts(report)
    places = len(report.findings())
    grouped = f" ({places} findings)" if places > sum(tally.values()) else ""
    return (
        f"{report.verdict.upper()}: {tally['error']} errors, {tally['warning']} warnings, "
        f"{tally['info']} notes{grouped} in {report.duration_s:.1f} s"
    )


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def measurement_text(key: str, value: Any) -> str:
    """A measurement as a person reads it: bytes as GiB or MiB, seconds as s or ms (report.json keeps
    the raw number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if key == "bytes" or key.endswith("_bytes"):
            return human(float(value), "bytes")
        if key.endswith("_s"):
            return human(float(value), "seconds")
    return format_value(value)


def summary_sentence(report: Report) -> str:
    """What is wrong and where, in one sentence: the first error, where it is, and how many more."""
    grouped = causes(report)
    errors = [cause for cause in grouped if cause.severity == "error"]
    warnings = sum(1 for cause in grouped if cause.severity == "warning")
    if not errors:
        if report.verdict == "fail":
            failed = [r.probe for r in report.results if r.status == "fail"]
            return f"No error finding, but a check failed in {', '.join(failed)}."
        also = f", with {warnings} warning{'s' * (warnings != 1)}" if warnings else ""
        return f"Nothing here blocks the run: {len(report.results)} sections pass{also}."
    first = errors[0]
    sentence = first.title.rstrip(".")
    if first.where:
        module = first.where.module if first.count == 1 else None
        sentence += f", at {first.where.label()}" + (f" ({module})" if module else "")
    sections = sorted({place.section for place in first.places})
    if len(report.results) > 1:
        sentence += f", in {', '.join(sections[:3])}" + (f" and {len(sections) - 3} more" if len(sections) > 3 else "")
    if first.count > 1:
        sentence += f" ({first.count} places)"
    more = len(errors) - 1
    if more:
        sentence += f"; and {more} more error{'s' * (more != 1)}"
    return sentence + "."


def scalar_measurements(measurements: dict[str, Any]) -> dict[str, Any]:
    """The measurements that fit one table cell (lists and dicts go to the JSON)."""
    return {k: v for k, v in measurements.items() if not isinstance(v, dict | list)}


def repo_path(file: str) -> str:
    """A path as code-scanning and annotations match it to the repository: relative to the current
    folder when under it, else absolute."""
    path = Path(file)
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return path.as_posix()
