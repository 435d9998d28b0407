"""Recorded observations, judged in this process: what a probe saw on a real run (on this CPU, or on
an H200 for what only a GPU shows), kept as the observations.json its report folder held.

Assets live in tests/assets/observations/<machine>/<name>.json; `run` recordings keep their events
beside them in <name>.events/. tests/assets/observations/README.md says how each was recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import CODES
from dflashdoctor.observations import load
from dflashdoctor.registry import PROBES
from dflashdoctor.report import Finding, ProbeResult
from dflashdoctor.runs.observations import RunObservations

ASSETS = Path(__file__).parent.parent / "assets" / "observations"


def raw(name: str, probe: str | None = None) -> dict[str, Any]:
    """One probe's observations from a recording `machine/name` (its only probe unless named)."""
    probes = json.loads((ASSETS / f"{name}.json").read_text(encoding="utf-8"))["probes"]
    if probe is None:
        (probe,) = probes
    return probes[probe]


def observations(name: str, probe: str | None = None, **changes: Any) -> Any:
    """A recording loaded as its probe's typed observations; `changes` replace top-level fields (a
    variant of a real recording, such as a hook that would not install on another torch)."""
    document = json.loads((ASSETS / f"{name}.json").read_text(encoding="utf-8"))["probes"]
    probe = probe or next(iter(document))
    data = {**document[probe], **changes}
    if probe == "run":
        return RunObservations.read(data, ASSETS / f"{name}.events")
    return load(PROBES[probe].observations, data, strict=True)


def judged(name: str, probe: str | None = None, budgets: Budgets | None = None, **changes: Any) -> list[ProbeResult]:
    """The sections the probe's own judge makes of a recording."""
    document = json.loads((ASSETS / f"{name}.json").read_text(encoding="utf-8"))["probes"]
    probe = probe or next(iter(document))
    return PROBES[probe].judge(observations(name, probe, **changes), budgets or Budgets())


Case = str | tuple[str, dict[str, Any]]  # a recording, or one judged with changes (budgets=, fields)


def judged_case(case: Case) -> list[ProbeResult]:
    name, changes = case if isinstance(case, tuple) else (case, {})
    return judged(name, **changes)


def documented(results: list[ProbeResult], code: str) -> list[Finding]:
    """`found`, each at the severity codes.py gives the code (the one a judge cannot change)."""
    matches = found(results, code)
    assert all(f.severity == CODES[code][0] for f in matches), [f.severity for f in matches]
    return matches


def found(results: list[ProbeResult], code: str) -> list[Finding]:
    """Every finding with `code` in the sections, failing the test when there is none."""
    matches = [f for r in results for f in r.findings if f.code == code]
    assert matches, f"no {code} finding; found {sorted({f.code for r in results for f in r.findings})}"
    return matches


def codes(results: list[ProbeResult]) -> set[str]:
    return {f.code for r in results for f in r.findings}
