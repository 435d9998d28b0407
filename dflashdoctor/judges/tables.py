"""The tables and subject lines judges put in a section, worded once for every renderer."""

from __future__ import annotations

from typing import Any

from dflashdoctor.report import Bar, Comparison, Table, site_key
from dflashdoctor.shapes import AttentionShape

SITE_COLUMNS = ["module", "impl", "calls", "verdict", "origin", "where"]
_CHARTED_SITES = 24  # a chart of more bars than this reads as a blur: the costliest are drawn


def call_site_table(call_sites: list[dict[str, Any]]) -> Table:
    """A trace's call sites, one row each: a call inside a compiled graph is counted in graphs, and a
    call at a script's top level is named by its function."""
    rows = []
    for site in call_sites:
        where = f"{site.get('file')}:{site.get('line')}" if site.get("file") else ""
        graphs = site.get("compiled_into_graphs")
        calls = f"in {graphs} graph{'s' * (graphs > 1)}" if graphs and not site["calls"] else str(site["calls"])
        name = site["module"] or site.get("function") or ""
        rows.append([name, site["impl"], calls, site["verdict"], site.get("origin", ""), where])
    keys = [site_key(site.get("file"), site.get("line"), site.get("module")) for site in call_sites]
    return Table(title="call sites", columns=list(SITE_COLUMNS), rows=rows, wide_columns=["where"], row_sites=keys)


def _dense(site: dict[str, Any]) -> bool:
    return bool(site.get("dense_forward") or site.get("dense_backward"))


def _name(site: dict[str, Any]) -> str:
    return str(site.get("module") or site.get("function") or "?")


def call_site_charts(call_sites: list[dict[str, Any]]) -> list[Comparison]:
    """Per flex_attention call site: how many calls, and what one call builds in memory (a dense
    call its float32 score matrix, or the peak its kernel was measured to add; a fused call none).
    Dense sites first, then the most called, at most _CHARTED_SITES of each."""
    flex = [s for s in call_sites if s.get("impl") == "flex_attention"]
    if not flex:
        return []
    ranked = sorted(flex, key=lambda s: (not _dense(s), -(s.get("calls") or 0)))[:_CHARTED_SITES]
    more = f" ({_CHARTED_SITES} of {len(flex)} sites)" if len(flex) > _CHARTED_SITES else ""
    calls = Comparison(
        title=f"calls per call site{more}",
        unit="calls",
        bars=[Bar(_name(s), float(s.get("calls") or 0), "dense" if _dense(s) else "fused") for s in ranked],
    )
    memory = []
    for site in ranked:
        if _dense(site):
            peak = max(site.get("dense_forward_peak_bytes") or 0, site.get("dense_backward_peak_bytes") or 0)
            memory.append(Bar(_name(site), float(peak or site.get("score_matrix_bytes") or 0), "dense"))
        else:
            memory.append(Bar(_name(site), 0.0, "fused"))
    added = Comparison(
        title=f"memory one call builds: dense score matrix or measured peak, fused none{more}",
        unit="bytes",
        bars=memory,
    )
    return [calls, added] if any(_dense(s) for s in ranked) else [calls]


def shape_subject(device: str, device_name: str, shape: AttentionShape, mask: str) -> str:
    """check-compile's subject: where it ran and the attention shape it called the target with."""
    return f"{device} ({device_name}) · {shape.label()} · mask {mask}"
