"""Judging a recording again gives the report its run gave: the same sections, checks and findings.
A change to a judge that alters a verdict on a real run (on this CPU or on an H200) shows here."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.observations import dump
from dflashdoctor.registry import PROBES
from tests.unit.recorded import ASSETS, judged, observations, raw

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


OBSERVED = sorted(  # a probe's observations.json (a block's recording and a merged report are other shapes)
    p
    for p in ASSETS.glob("*/*.json")
    if not p.name.endswith(".report.json") and "probes" in json.loads(p.read_text(encoding="utf-8"))
)


@pytest.mark.parametrize("path", OBSERVED, ids=[f"{p.parent.name}/{p.stem}" for p in OBSERVED])
def test_judging_leaves_the_observations_as_the_probe_wrote_them(path):
    """The report keeps the observations after its judges ran: a judge that wrote into a record (an
    evidence dict that was the record itself) would change what the folder says the probe saw, and
    the next strict load of it would fail. Found on an H200 gate run: the race judge's warning added
    its forced reproduction to the audit record it had taken as evidence."""
    name = f"{path.parent.name}/{path.stem}"
    for probe in json.loads(path.read_text(encoding="utf-8"))["probes"]:
        if probe == "run":  # read from its events, not loaded: the run judge has its own tests
            continue
        for budgets in (Budgets(), Budgets(held_by_gate=True)):  # a command alone, and the gate
            loaded = observations(name, probe)
            PROBES[probe].judge(loaded, budgets)
            assert dump(loaded) == raw(name, probe), (probe, budgets)
