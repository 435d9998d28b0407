"""Putting the gate's sections together. Each probe is judged by its own judge, against the gate's
budgets, before it gets here; the one thing left is a finding two sections make alike.
"""

from __future__ import annotations

from dflashdoctor.report import ProbeResult


def drop_repeated_findings(results: list[ProbeResult]) -> None:
    """env looks at everything a little; a finding it makes alike with a dedicated probe (env and
    cache check both see a cache root on NFS) is kept once, in the dedicated probe's section, with
    the fuller evidence, whatever the order of `probes`."""
    elsewhere = {(f.code, f.title) for r in results if r.probe != "env" for f in r.findings}
    for result in results:
        if result.probe != "env":
            continue
        kept = [f for f in result.findings if (f.code, f.title) not in elsewhere]
        moved = {f.code for f in result.findings} - {f.code for f in kept}
        if moved:
            result.findings = kept
            for check in result.checks:
                if moved & set(check.codes):
                    check.summary += " (the finding is in another section of this report)"
