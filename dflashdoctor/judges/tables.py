"""The tables and subject lines judges put in a section, worded once for every renderer."""

from __future__ import annotations

from typing import Any

from dflashdoctor.report import Table

SITE_COLUMNS = ["module", "impl", "calls", "verdict", "origin", "where"]


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
    return Table(title="call sites", columns=list(SITE_COLUMNS), rows=rows, wide_columns=["where"])


def shape_subject(device: str, device_name: str, shape: dict[str, Any], mask: str) -> str:
    """check-compile's subject: where it ran and the attention shape it called the target with."""
    return (
        f"{device} ({device_name}) · B{shape['batch']} "
        f"H{shape['heads']}/{shape['kv_heads']} q{shape['q_len']} kv{shape['kv_len']} "
        f"d{shape['head_dim']} {shape['dtype']} · mask {mask}"
    )
