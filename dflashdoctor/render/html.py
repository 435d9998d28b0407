"""One self-contained HTML file, the page a team shares: no scripts, no fonts, nothing fetched; every
string escaped.

At the top, one sentence says what is wrong and where. Each section has its checks, its tables, its
charts (svg.py: bars for comparisons, lines for per-step plots; the gate also gets one bar per
probe with its time), its findings and its measurements in human units. A finding at a call site
links to that site's table row and the row back to its findings. Colours are CSS variables: dark
mode follows the reader's system, and printing opens every evidence block.
"""

from __future__ import annotations

import json
import re
from html import escape

from dflashdoctor.causes import Cause, group
from dflashdoctor.render.common import (
    CHECK_MARKS,
    measurement_text,
    scalar_measurements,
    subject,
    summary_sentence,
    verdict_line,
)
from dflashdoctor.render.svg import bar_chart, line_chart, timeline_chart
from dflashdoctor.report import Bar, Comparison, Finding, ProbeResult, Report, site_key
from dflashdoctor.safe_text import with_strings, xml_legal

_STYLE = """
:root{--fg:#222;--bg:#fff;--muted:#666;--line:#ddd;--code:#f6f6f6;--good:#16794c;--bad:#b3261e;
--warn:#946200;--info:#41699b;--s0:#41699b;--s1:#c05a00;--s2:#16794c;--s3:#7a3e9d;--s4:#946200;--s5:#2b8a9d}
@media (prefers-color-scheme:dark){:root{--fg:#e6e6e6;--bg:#17191c;--muted:#9aa0a6;--line:#3a3d42;
--code:#23262a;--good:#5cc58a;--bad:#ff7b72;--warn:#e3b341;--info:#79a6e8;--s0:#79a6e8;--s1:#f0883e;
--s2:#5cc58a;--s3:#c297e8;--s4:#e3b341;--s5:#56c2d6}}
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:72em;color:var(--fg);background:var(--bg);
padding:0 1em;overflow-wrap:break-word}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid var(--line)}
code,pre{font:12px ui-monospace,monospace}pre{background:var(--code);padding:.6em;overflow:auto;max-height:24em}
table{border-collapse:collapse;margin:.5em 0;display:block;max-width:100%;overflow-x:auto}
p code,li code,h3 code{overflow-wrap:anywhere}td,th{border:1px solid var(--line);padding:.25em .6em;text-align:left}
td{overflow-wrap:break-word}.wide{overflow-x:auto}
a{color:var(--info)}.pass,.good{color:var(--good)}.fail,.error,.bad{color:var(--bad)}
.warn,.warning{color:var(--warn)}.info,.skip{color:var(--info)}
.summary{font-size:1.1em;border-left:4px solid var(--info);padding:.3em .8em}.summary.fail,.summary.error{
border-color:var(--bad)}.summary.pass{border-color:var(--good)}
.verdict{font-size:1.2em;font-weight:bold}
.finding{border-left:4px solid var(--line);padding:.2em .9em;margin:1em 0}
.places{margin:.2em 0;padding-left:1.4em}.times{color:var(--muted);font-weight:normal}
.finding.error{border-color:var(--bad)}.finding.warning{border-color:var(--warn)}.finding.info{border-color:var(--info)}
tr:target,.finding:target{outline:2px solid var(--info)}
.charts{display:flex;flex-wrap:wrap;gap:1.5em}figure.chart-box{margin:.5em 0}figcaption{font-weight:bold}
svg.chart{max-width:100%;height:auto}figure.chart-box{max-width:100%}
svg.chart text{font:12px system-ui,sans-serif;fill:var(--fg)}svg.chart .axis{stroke:var(--muted)}
svg.chart .mark{stroke:var(--bad);stroke-dasharray:4 3}svg.chart .mark-label{fill:var(--bad)}
svg.chart rect.good{fill:var(--good)}svg.chart rect.bad{fill:var(--bad)}
.line{fill:none;stroke-width:1.6}
.s0{fill:var(--s0);stroke:var(--s0)}.s1{fill:var(--s1);stroke:var(--s1)}.s2{fill:var(--s2);stroke:var(--s2)}
.s3{fill:var(--s3);stroke:var(--s3)}.s4{fill:var(--s4);stroke:var(--s4)}.s5{fill:var(--s5);stroke:var(--s5)}
polyline.s0,polyline.s1,polyline.s2,polyline.s3,polyline.s4,polyline.s5{fill:none}
.legend{margin-right:1em}.legend::before{content:"";display:inline-block;width:.9em;height:.9em;margin-right:.3em;
background:currentColor;vertical-align:middle}
.legend.s0{color:var(--s0)}.legend.s1{color:var(--s1)}.legend.s2{color:var(--s2)}.legend.s3{color:var(--s3)}
.legend.s4{color:var(--s4)}.legend.s5{color:var(--s5)}
@media print{body{max-width:none;margin:0}pre{max-height:none;white-space:pre-wrap}
details>*{display:block}details::details-content{content-visibility:visible;display:block}
h2{break-after:avoid}.finding,figure{break-inside:avoid}a{color:inherit;text-decoration:none}}
"""


class _Anchors:
    """Ids of findings and call-site rows in one section, and which point at which."""

    def __init__(self, index: int, result: ProbeResult) -> None:
        self.index = index
        self.rows: dict[str, str] = {}  # site key -> row id
        for t, table in enumerate(result.tables):
            for r, key in enumerate(table.row_sites):
                if key.strip(":"):
                    self.rows.setdefault(key, f"s{index}-t{t}-r{r}")
        self.findings_at: dict[str, list[tuple[str, str]]] = {}  # row id -> (finding id, its code)
        for i, f in enumerate(result.findings):
            row = self.row_of(f)
            if row is not None:
                self.findings_at.setdefault(row, []).append((self.finding_id(i), f.code))

    def finding_id(self, i: int) -> str:
        return f"s{self.index}-f{i}"

    def row_of(self, f: Finding) -> str | None:
        if f.where is None:
            return None
        return self.rows.get(site_key(f.where.file, f.where.line, f.where.module))


_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"https?://[^\s<>\"'`]+[^\s<>\"'`.,;:)]")


def prose(text: str) -> str:
    """A finding's words as HTML: escaped, then its `code` spans as code and its URLs as links (the
    texts are written as Markdown-ish prose; shown raw, the backticks were noise)."""
    escaped = escape(text)
    escaped = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escaped)
    return _LINK.sub(lambda m: f'<a href="{m.group(0)}">{m.group(0)}</a>', escaped)


def _linked(text: str, row: str | None) -> str:
    return f'<a href="#{row}">{escape(text)}</a>' if row else escape(text)


def _cause(cause: Cause, anchors: list[str], rows: list[str | None]) -> str:
    """One cause of a section: told once, its places listed, every finding's anchor kept (the call
    site tables link to each)."""
    f = cause.first
    times = f' <span class="times">×{cause.count}</span>' if cause.count > 1 else ""
    out = [
        f'<div class="finding {escape(f.severity)}" id="{anchors[0]}">',
        *(f'<span id="{anchor}"></span>' for anchor in anchors[1:]),
        f"<h3><code>{escape(f.code)}</code> {prose(cause.title)}{times}</h3>",
    ]
    if f.where:
        module = f" ({escape(f.where.module)})" if f.where.module and cause.count == 1 else ""
        link = f' · <a href="#{rows[0]}">its call-site row</a>' if rows[0] and cause.count == 1 else ""
        out.append(f"<p>at <code>{escape(f.where.label())}</code>{module}{link}</p>")
    if cause.count > 1:
        pairs = zip(cause.places, rows, strict=True)
        items = "".join(f"<li>{_linked(cause.place_label(place), row)}</li>" for place, row in pairs)
        out.append(f'<ul class="places">{items}</ul>')
    if f.detail:
        out.append(f"<p>{prose(f.detail)}</p>")
    if f.fix:
        out.append(f"<p><b>Fix:</b> {prose(f.fix)}</p>")
    if f.refs:
        out.append("<p>" + " ".join(f"<code>{escape(r)}</code>" for r in f.refs) + "</p>")
    if f.evidence:
        evidence = json.dumps(f.evidence, indent=2, default=str)
        out.append(f"<details><summary>evidence</summary><pre>{escape(evidence)}</pre></details>")
    out.append("</div>")
    return "".join(out)


def _tables(result: ProbeResult, anchors: _Anchors) -> list[str]:
    out = []
    for t, table in enumerate(result.tables):
        if not table.rows:
            continue
        linked = bool(anchors.findings_at) and bool(table.row_sites)
        head = "".join(f"<th>{escape(c)}</th>" for c in table.columns) + ("<th>findings</th>" if linked else "")
        rows = []
        for r, row in enumerate(table.rows):
            row_id = f"s{anchors.index}-t{t}-r{r}"
            cells = "".join(f"<td>{escape(c)}</td>" for c in row)
            if linked:
                found = anchors.findings_at.get(row_id, [])
                cells += "<td>" + " ".join(f'<a href="#{f}">{escape(code)}</a>' for f, code in found) + "</td>"
            rows.append(f'<tr id="{row_id}">{cells}</tr>')
        out.append(
            f'<h3>{escape(table.title.capitalize())}</h3><div class="wide"><table><tr>{head}</tr>{"".join(rows)}'
            "</table></div>"
        )
    return out


def _probe_times(report: Report) -> str:
    """The gate: what ran when, each probe from its start to its end (they run side by side: their
    times add up to more than the gate took); a report written before starts were kept gets one bar
    per probe with its time."""
    if report.command != "gate" or not report.results:
        return ""
    starts = [r.measurements.get("started_after_s") for r in report.results]
    known = [float(start) for start in starts if isinstance(start, int | float)]
    if len(known) == len(starts):
        spans = [(r.probe, s, s + r.duration_s, r.status) for r, s in zip(report.results, known, strict=True)]
        return f'<div class="charts">{timeline_chart("what ran when", spans)}</div>'
    bars = [Bar(r.probe, r.duration_s, r.status) for r in report.results]
    return f'<div class="charts">{bar_chart(Comparison("time per probe", "seconds", bars))}</div>'


def _section(index: int, result: ProbeResult) -> list[str]:
    anchors = _Anchors(index, result)
    body = [f'<h2>{escape(result.probe)}: <span class="{escape(result.status)}">{escape(result.status)}</span></h2>']
    if result.subject:
        body.append(f"<p><code>{escape(result.subject)}</code></p>")
    if result.checks:
        rows = "".join(
            f'<tr><td>{escape(c.name)}</td><td class="{escape(c.status)}">{CHECK_MARKS[c.status]}</td>'
            f"<td>{escape(c.summary)}</td></tr>"
            for c in result.checks
        )
        body.append(f"<table><tr><th>check</th><th>result</th><th>summary</th></tr>{rows}</table>")
    body += _tables(result, anchors)
    charts = [bar_chart(c) for c in result.comparisons if c.bars] + [line_chart(p) for p in result.plots]
    charts = [c for c in charts if c]
    if charts:
        body.append('<div class="charts">' + "".join(charts) + "</div>")
    ids = {id(f): anchors.finding_id(i) for i, f in enumerate(result.findings)}
    for cause in group((result.probe, f) for f in result.findings):
        body.append(_cause(cause, [ids[id(f)] for f in cause.findings], [anchors.row_of(f) for f in cause.findings]))
    scalars = scalar_measurements(result.measurements)
    if scalars:  # the raw numbers, for whoever wants them: closed, under the section's story
        rows = "".join(
            f"<tr><td>{escape(k.replace('_', ' '))}</td><td>{escape(measurement_text(k, v))}</td></tr>"
            for k, v in scalars.items()
        )
        body.append(f"<details><summary>Measurements</summary><table>{rows}</table></details>")
    return body


def render_html(report: Report) -> str:
    report = with_strings(report, xml_legal)  # `escape` handles markup; control characters are not HTML
    body = [
        f"<h1>dflashdoctor {escape(report.command)}</h1>",
        f'<p class="summary {escape(report.verdict)}">{escape(summary_sentence(report))}</p>',
        f"<p><code>{escape(subject(report))}</code></p>",
        f'<p class="verdict {escape(report.verdict)}">{escape(verdict_line(report))}</p>',
        f"<p>started {escape(report.started)} · <code>{escape(' '.join(report.argv))}</code></p>",
        _probe_times(report),
    ]
    for index, result in enumerate(report.results):
        body += _section(index, result)
    env = "".join(
        f"<tr><td>{escape(str(k))}</td><td>{escape(measurement_text(str(k), v))}</td></tr>"
        for k, v in report.environment.items()
    )
    body.append(f"<h2>Environment</h2><table>{env}</table>")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<title>dflashdoctor {escape(report.command)}: {escape(report.verdict)}</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
