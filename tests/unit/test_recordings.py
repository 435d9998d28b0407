"""Judging a recording again gives the report its run gave: the same sections, checks and findings.
A change to a judge that alters a verdict on a real run (on this CPU or on an H200) shows here."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from tests.unit.recorded import ASSETS, judged

RECORDED = sorted(ASSETS.glob("*/*.report.json"))


def _said(sections: list[dict]) -> list[tuple]:
    """What a reader acts on: each section's verdict, its checks and its findings."""
    return [
        (
            s["probe"],
            s["status"],
            [(c["name"], c["status"], c["summary"]) for c in s["checks"]],
            [(f["code"], f["severity"], f["title"]) for f in s["findings"]],
        )
        for s in sections
    ]


@pytest.mark.parametrize(
    "path", RECORDED, ids=[f"{p.parent.name}/{p.name.removesuffix('.report.json')}" for p in RECORDED]
)
def test_a_recording_is_judged_as_its_run_judged_it(path):
    name = f"{path.parent.name}/{path.name.removesuffix('.report.json')}"
    report = json.loads(path.read_text(encoding="utf-8"))
    again = [asdict(section) for section in judged(name)]
    assert _said(again) == _said(report["results"])
