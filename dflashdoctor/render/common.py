"""Small wording helpers shared by the renderers, so every format says the same thing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashdoctor.report import Report

CHECK_MARKS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "info": "INFO", "skip": "SKIP"}


def subject(report: Report) -> str:
    """One line naming what was examined: target, device, shape, mask, torch."""
    env = report.environment
    parts = [env.get("target", "")]
    for result in report.results:
        shape = result.measurements.get("shape")
        if shape:
            parts.append(
                f"{env.get('device', '?')} ({env.get('device_name', '?')}) · B{shape['batch']} "
                f"H{shape['heads']}/{shape['kv_heads']} q{shape['q_len']} kv{shape['kv_len']} "
                f"d{shape['head_dim']} {shape['dtype']} · mask {result.measurements.get('mask')}"
            )
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    return " · ".join(p for p in parts if p)


def counts(report: Report) -> dict[str, int]:
    tally = {"error": 0, "warning": 0, "info": 0}
    for f in report.findings():
        tally[f.severity] += 1
    return tally


def verdict_line(report: Report) -> str:
    tally = counts(report)
    return (
        f"{report.verdict.upper()}: {tally['error']} errors, {tally['warning']} warnings, "
        f"{tally['info']} notes in {report.duration_s:.1f} s"
    )


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def scalar_measurements(measurements: dict[str, Any]) -> dict[str, Any]:
    """The measurements that fit one table cell (lists and dicts go to the JSON)."""
    return {k: v for k, v in measurements.items() if not isinstance(v, dict | list)}


SITE_COLUMNS = ("module", "impl", "calls", "verdict", "origin", "where")


def repo_path(file: str) -> str:
    """A path as code-scanning and annotations match it to the repository: relative to the current
    folder when under it, else absolute."""
    path = Path(file)
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return path.as_posix()


def site_rows(measurements: dict[str, Any]) -> list[tuple[str, ...]]:
    """The call-site table of a trace, one tuple of SITE_COLUMNS per site (empty when none)."""
    rows = []
    for site in measurements.get("call_sites") or []:
        where = f"{site.get('file')}:{site.get('line')}" if site.get("file") else ""
        graphs = site.get("compiled_into_graphs")
        calls = f"in {graphs} graph{'s' * (graphs > 1)}" if graphs and not site["calls"] else str(site["calls"])
        name = site["module"] or site.get("function") or ""  # a call at a script's top level has no module
        rows.append((name, site["impl"], calls, site["verdict"], site.get("origin", ""), where))
    return rows
