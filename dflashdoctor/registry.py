"""Every probe, by name: the one place the CLI, the gate and the runner look a probe up."""

from __future__ import annotations

from dflashdoctor.commands import cache, check_compile, env, race, run, trace_attention, versions
from dflashdoctor.probe_spec import ProbeSpec

PROBES: dict[str, ProbeSpec] = {
    spec.name: spec
    for spec in (
        env.SPEC,
        check_compile.SPEC,
        trace_attention.SPEC,
        race.SPEC,
        cache.SPEC,
        run.SPEC,
        versions.SPEC,
    )
}
