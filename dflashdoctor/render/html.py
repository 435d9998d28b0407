"""One self-contained HTML file: no scripts, no fonts, nothing fetched; every string escaped.

Comparisons (dense versus fused peak memory, first versus warm call time) are drawn as inline
SVG bar charts on a log scale, since the values people compare here differ by orders of magnitude.
"""

from __future__ import annotations

import json
import math
from html import escape

from dflashdoctor.render.common import (
    CHECK_MARKS,
    format_value,
    scalar_measurements,
    subject,
    verdict_line,
)
from dflashdoctor.render.text import with_strings, xml_legal
from dflashdoctor.report import Comparison, Finding, Report

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}code,pre{font:12px ui-monospace,monospace}
pre{background:#f6f6f6;padding:.6em;overflow:auto;max-height:24em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
.pass{color:#16794c}.fail,.error{color:#b3261e}.warn,.warning{color:#946200}.info,.skip{color:#41699b}
.verdict{font-size:1.2em;font-weight:bold}.finding{border-left:4px solid #ccc;padding:.2em .9em;margin:1em 0}
.finding.error{border-color:#b3261e}.finding.warning{border-color:#c89000}.finding.info{border-color:#41699b}
.charts{display:flex;flex-wrap:wrap;gap:1.5em}
"""
_BAR_COLORS = ("#41699b", "#b3261e", "#16794c", "#946200")
_UNITS = {"bytes": ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")), "seconds": ((1, "s"), (1e-3, "ms"))}


def _human(value: float, unit: str) -> str:
    scales = _UNITS.get(unit)
    if not scales:
        return f"{value:.3g} {unit}"
    scale, suffix = next(((s, x) for s, x in scales if abs(value) >= s), scales[-1])
    return f"{value / scale:.3g} {suffix}"


def _chart(comparison: Comparison) -> str:
    """Horizontal bars, log-scaled so a 200x difference still shows both bars."""
    bars = comparison.bars
    width, row, label_w = 460, 26, 150
    top = max(b.value for b in bars) if bars else 1
    floor = min((b.value for b in bars if b.value > 0), default=1) / 10
    span = math.log10(max(top, floor * 10) / floor)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + label_w + 90}" height="{row * len(bars) + 30}" '
        f'role="img" aria-label="{escape(comparison.title)}">',
        f'<text x="0" y="14" font-size="13" font-weight="bold">{escape(comparison.title)} (log scale)</text>',
    ]
    for i, bar in enumerate(bars):
        y = 24 + i * row
        length = 2 if bar.value <= 0 else max(2, width * math.log10(bar.value / floor) / span)
        color = _BAR_COLORS[i % len(_BAR_COLORS)]
        parts.append(f'<text x="0" y="{y + 15}" font-size="12">{escape(bar.label)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{length:.1f}" height="{row - 8}" fill="{color}"/>')
        value = escape(_human(bar.value, comparison.unit))
        parts.append(f'<text x="{label_w + length + 6:.1f}" y="{y + 15}" font-size="12">{value}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _finding(f: Finding) -> str:
    out = [f'<div class="finding {escape(f.severity)}">', f"<h3><code>{escape(f.code)}</code> {escape(f.title)}</h3>"]
    if f.where:
        out.append(f"<p>at <code>{escape(f.where.label())}</code></p>")
    if f.detail:
        out.append(f"<p>{escape(f.detail)}</p>")
    if f.fix:
        out.append(f"<p><b>Fix:</b> {escape(f.fix)}</p>")
    if f.refs:
        out.append("<p>" + " ".join(f"<code>{escape(r)}</code>" for r in f.refs) + "</p>")
    if f.evidence:
        evidence = json.dumps(f.evidence, indent=2, default=str)
        out.append(f"<details><summary>evidence</summary><pre>{escape(evidence)}</pre></details>")
    out.append("</div>")
    return "".join(out)


def render_html(report: Report) -> str:
    report = with_strings(report, xml_legal)  # `escape` handles markup; control characters are not HTML
    body = [
        f"<h1>dflashdoctor {escape(report.command)}</h1>",
        f"<p><code>{escape(subject(report))}</code></p>",
        f'<p class="verdict {escape(report.verdict)}">{escape(verdict_line(report))}</p>',
        f"<p>started {escape(report.started)} · <code>{escape(' '.join(report.argv))}</code></p>",
    ]
    for result in report.results:
        body.append(
            f'<h2>{escape(result.probe)}: <span class="{escape(result.status)}">{escape(result.status)}</span></h2>'
        )
        if result.checks:
            rows = "".join(
                f'<tr><td>{escape(c.name)}</td><td class="{escape(c.status)}">{CHECK_MARKS[c.status]}</td>'
                f"<td>{escape(c.summary)}</td></tr>"
                for c in result.checks
            )
            body.append(f"<table><tr><th>check</th><th>result</th><th>summary</th></tr>{rows}</table>")
        for table in result.tables:
            if table.rows:
                head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
                rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in table.rows)
                body.append(f"<h3>{escape(table.title.capitalize())}</h3><table><tr>{head}</tr>{rows}</table>")
        charts = [c for c in result.comparisons if c.bars]
        if charts:
            body.append('<div class="charts">' + "".join(_chart(c) for c in charts) + "</div>")
        body.extend(_finding(f) for f in result.findings)
        scalars = scalar_measurements(result.measurements)
        if scalars:
            rows = "".join(
                f"<tr><td>{escape(k)}</td><td>{escape(format_value(v))}</td></tr>" for k, v in scalars.items()
            )
            body.append(f"<h3>Measurements</h3><table>{rows}</table>")
    env = "".join(f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>" for k, v in report.environment.items())
    body.append(f"<h2>Environment</h2><table>{env}</table>")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>dflashdoctor {escape(report.command)}: {escape(report.verdict)}</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
