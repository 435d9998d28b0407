"""Inline SVG charts for the HTML report: bars (comparisons) and lines over steps (plots).

Self-contained (no script, no font, nothing fetched), every string escaped, colours taken from the
page's CSS variables so dark mode and print restyle them. Each chart is a <figure> whose caption
says what it shows and whose table says the same numbers in text, for a reader the picture fails.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from dflashdoctor.report import Comparison, Plot

_UNITS = {"bytes": ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")), "seconds": ((1, "s"), (1e-3, "ms"))}
_NOTE_CLASS = {
    "dense": "bad",
    "failed": "bad",
    "fail": "bad",
    "error": "bad",
    "fused": "good",
    "passed": "good",
    "pass": "good",
}
_LINE_CLASSES = ("s0", "s1", "s2", "s3", "s4", "s5")


def human(value: float, unit: str) -> str:
    """A value as a person reads it: 8.28 GiB, 12.3 ms, 7 calls."""
    if not math.isfinite(value):
        return f"{value} {unit}"
    scales = _UNITS.get(unit)
    if not scales:
        word = unit.removesuffix("s") if value == 1 and unit.endswith("s") else unit  # 1 call, 2 calls
        return f"{value:.4g} {word}"
    if value == 0:
        return f"0 {scales[-1][1]}"
    scale, suffix = next(((s, x) for s, x in scales if abs(value) >= s), scales[-1])
    return f"{value / scale:.3g} {suffix}"


def timeline_chart(title: str, spans: Sequence[tuple[str, float, float, str]]) -> str:
    """What ran when: a row per span (label, start and end seconds, note), drawn from the same zero,
    so probes that ran side by side overlap, and the axis ends at the wall time, not their sum."""
    spans = [
        (label, start, end, note) for label, start, end, note in spans if math.isfinite(start + end) and end >= start
    ]
    if not spans:
        return ""
    width, row, label_w, value_w = 420, 24, 150, 110
    end_all = max(end for _, _, end, _ in spans) or 1.0
    height = row * len(spans) + 26
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{label_w + width + value_w}" '
        f'height="{height}" viewBox="0 0 {label_w + width + value_w} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for i, (label, start, end, note) in enumerate(spans):
        y = 4 + i * row
        x = label_w + width * start / end_all
        size = max(2.0, width * (end - start) / end_all)
        kind = _NOTE_CLASS.get(note, _LINE_CLASSES[i % len(_LINE_CLASSES)])
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{escape(label[:24])}</text>')
        parts.append(f'<rect class="{kind}" x="{x:.1f}" y="{y + 3}" width="{size:.1f}" height="{row - 8}"/>')
        parts.append(f'<text x="{x + size + 6:.1f}" y="{y + 15}">{escape(human(end - start, "seconds"))}</text>')
    axis_y = 4 + len(spans) * row + 2
    parts.append(f'<line class="axis" x1="{label_w}" y1="{axis_y}" x2="{label_w + width}" y2="{axis_y}"/>')
    for tick in _round_ticks(0.0, end_all, "seconds"):
        if tick <= end_all * 1.001:
            x = label_w + width * tick / end_all
            parts.append(
                f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">{escape(human(tick, "seconds"))}</text>'
            )
    parts.append("</svg>")
    rows = [[label, human(start, "seconds"), human(end, "seconds"), note] for label, start, end, note in spans]
    table = _text_table(["", "from", "to", "verdict"], rows)
    return f'<figure class="chart-box"><figcaption>{escape(title)}</figcaption>{"".join(parts)}{table}</figure>'


def _log_scaled(values: list[float], unit: str) -> bool:
    """Bytes and seconds that differ by orders of magnitude: a log scale shows both a 200x pair."""
    positive = [v for v in values if v > 0]
    return unit in _UNITS and len(positive) >= 2 and max(positive) / min(positive) > 20


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f'<details class="chart-text"><summary>as text</summary><table><tr>{header}</tr>{cells}</table></details>'


def bar_chart(comparison: Comparison) -> str:
    bars = [b for b in comparison.bars if math.isfinite(b.value)]
    width, row, label_w, value_w = 420, 24, 190, 110
    values = [max(b.value, 0.0) for b in bars]
    log = _log_scaled(values, comparison.unit)
    top = max(values, default=0) or 1.0
    floor = min((v for v in values if v > 0), default=1.0) / 10

    def length(value: float) -> float:
        if value <= 0:
            return 2.0
        if log:
            return max(2.0, width * math.log10(value / floor) / math.log10(top / floor))
        return max(2.0, width * value / top)

    height = row * len(bars) + 8
    scale = " (log scale)" if log else ""
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{label_w + width + value_w}" '
        f'height="{height}" viewBox="0 0 {label_w + width + value_w} {height}" role="img" '
        f'aria-label="{escape(comparison.title)}"><title>{escape(comparison.title)}</title>'
    ]
    for i, (bar, value) in enumerate(zip(bars, values, strict=True)):
        y = 4 + i * row
        size = length(value)
        kind = _NOTE_CLASS.get(bar.note, _LINE_CLASSES[i % len(_LINE_CLASSES)])
        label = bar.label if len(bar.label) <= 28 else bar.label[:27] + "…"
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        parts.append(f'<rect class="{kind}" x="{label_w}" y="{y + 3}" width="{size:.1f}" height="{row - 8}"/>')
        shown = human(value, comparison.unit) + (f" {bar.note}" if bar.note else "")
        parts.append(f'<text x="{label_w + size + 6:.1f}" y="{y + 15}">{escape(shown)}</text>')
    parts.append("</svg>")
    rows = [[b.label, human(b.value, comparison.unit), b.note] for b in comparison.bars]
    caption = f"<figcaption>{escape(comparison.title)}{scale}</figcaption>"
    return f'<figure class="chart-box">{caption}{"".join(parts)}{_text_table(["", "value", "kind"], rows)}</figure>'


def _ticks(low: float, high: float, count: int = 4) -> list[float]:
    if high <= low:
        return [low]
    # weighted, not low + (high - low) * i / count: the span overflows near the float limit
    return [low * (1 - i / count) + high * (i / count) for i in range(count + 1)]


_NICE = (1.0, 2.0, 2.5, 5.0, 10.0)


def _round_ticks(low: float, high: float, unit: str, count: int = 4) -> list[float]:
    """Ticks at round numbers of the unit they are read in (0, 5, 10, 15 GiB; not 26.6, 53.2), from
    at or below `low` to at or above `high`; the even split where rounding cannot work (a span near
    the float limit, or none)."""
    scales = _UNITS.get(unit, ((1, ""),))
    top = max(abs(low), abs(high))
    scale = next((s for s, _ in scales if top >= s), scales[-1][0])
    span = (high - low) / scale
    if not (math.isfinite(span) and span > 0):
        return _ticks(low, high, count)
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(n for n in _NICE if n * magnitude >= raw) * magnitude * scale
    first, last = math.floor(low / step), math.ceil(high / step)
    if not (math.isfinite(first * step) and math.isfinite(last * step)) or last - first > 4 * count:
        return _ticks(low, high, count)
    return [i * step for i in range(int(first), int(last) + 1)]


def _fraction(value: float, low: float, high: float) -> float:
    """Where `value` lies from `low` (0) to `high` (1), for values anywhere in the float range."""
    span = high / 2 - low / 2
    return (value / 2 - low / 2) / span if span else 0.0


def line_chart(plot: Plot) -> str:
    finite = [[(x, y) for x, y in line.points if math.isfinite(x) and math.isfinite(y)] for line in plot.lines]
    points = [point for line in finite for point in line]
    xs = [x for x, _ in points] + [m.x for m in plot.marks if math.isfinite(m.x)]
    if not xs or (not plot.marks and all(y == 0 for _, y in points)):  # nothing measured (memory on a CPU)
        return ""
    left, right, top_pad, bottom, width, height = 70, 16, 12, 34, 520, 180
    x_low, x_high = min(xs), max(xs)
    ys = [y for _, y in points]
    y_low, y_high = min([0.0, *ys]), max([0.0, *ys])  # the axis is at zero; values below it are drawn too
    if y_high == y_low:
        y_high = y_low + 1.0
    y_ticks = _round_ticks(y_low, y_high, plot.unit)
    y_low, y_high = min(y_low, y_ticks[0]), max(y_high, y_ticks[-1])  # the axis ends on a round tick

    def px(x: float) -> float:
        return left + _fraction(x, x_low, x_high) * width

    def py(y: float) -> float:
        return top_pad + height - _fraction(y, y_low, y_high) * height

    total_w, total_h = left + width + right, top_pad + height + bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{total_w}" height="{total_h}" '
        f'viewBox="0 0 {total_w} {total_h}" role="img" aria-label="{escape(plot.title)}">'
        f"<title>{escape(plot.title)}</title>",
        f'<line class="axis" x1="{left}" y1="{py(0):.1f}" x2="{left + width}" y2="{py(0):.1f}"/>',
        f'<line class="axis" x1="{left}" y1="{top_pad}" x2="{left}" y2="{top_pad + height}"/>',
    ]
    for tick in y_ticks:
        label = escape(human(tick, plot.unit))
        parts.append(f'<text x="{left - 6}" y="{py(tick) + 4:.1f}" text-anchor="end">{label}</text>')
    for tick in sorted({round(t) for t in _ticks(x_low, x_high, 4 if x_high - x_low >= 4 else 1)}):  # whole steps
        parts.append(f'<text x="{px(tick):.1f}" y="{top_pad + height + 16}" text-anchor="middle">{tick}</text>')
    parts.append(f'<text x="{left + width / 2}" y="{total_h - 2}" text-anchor="middle">{escape(plot.x_label)}</text>')
    for i, mark in enumerate(plot.marks):
        if math.isfinite(mark.x):
            x = px(mark.x)
            parts.append(f'<line class="mark" x1="{x:.1f}" y1="{top_pad}" x2="{x:.1f}" y2="{top_pad + height}"/>')
            # a mark near the right edge is labelled on its left, inside the chart
            side = 'text-anchor="end"' if x > left + width * 0.6 else ""
            offset = -3 if side else 3
            y = top_pad + 10 + 13 * (i % 2)
            label = escape(mark.label)
            parts.append(f'<text class="mark-label" x="{x + offset:.1f}" y="{y}" {side}>{label}</text>')
    for i, points in enumerate(finite):
        kind = _LINE_CLASSES[i % len(_LINE_CLASSES)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        if " " in coords:
            parts.append(f'<polyline class="line {kind}" points="{coords}"/>')
        elif coords:  # one step: a dot
            cx, cy = coords.split(",")
            parts.append(f'<circle class="{kind}" cx="{cx}" cy="{cy}" r="3"/>')
    parts.append("</svg>")
    legend = "".join(
        f'<span class="legend {_LINE_CLASSES[i % len(_LINE_CLASSES)]}">{escape(line.label)}</span>'
        for i, line in enumerate(plot.lines)
    )
    rows = []
    for line, kept in zip(plot.lines, finite, strict=True):
        values = [y for _, y in kept]  # what is drawn is what the table says
        if values:
            said = [human(y, plot.unit) for y in (values[0], max(values), values[-1])]
            rows.append([line.label, str(len(values)), *said])
    rows += [[f"mark: {m.label}", f"{plot.x_label} {m.x:g}", "", "", ""] for m in plot.marks]
    table = _text_table(["", "points", "first", "highest", "last"], rows)
    caption = f"<figcaption>{escape(plot.title)}</figcaption>"
    return f'<figure class="chart-box">{caption}{"".join(parts)}<div>{legend}</div>{table}</figure>'
