"""What the gate adds to the probes' own verdicts: budgets, and the race judged for this pipeline.

The probes judge against their own defaults; the gate holds a run to the team's budgets
(recompiles, graph breaks, compile time), each overrun a `budget-exceeded` error naming the budget;
a dense backward is an error unless `require_fused_backward = false`. The race probe's forced
reproduction proves the installed triton's autotuner is racy; that is a pipeline's error only when
it runs autotuned kernels from several threads at once (`threaded_autotuners`), otherwise a warning
with the reproduction as evidence.
"""

from __future__ import annotations

from typing import Any

from dflashdoctor.codes import finding
from dflashdoctor.gate.config import GateConfig
from dflashdoctor.report import Check, CheckStatus, ProbeResult

_RACE_ERRORS = ("autotuner-race", "concurrent-autotuner-entry")


def _over(result: ProbeResult, budget: str, measured: Any, limit: Any, what: str) -> None:
    result.findings.append(
        finding(
            "budget-exceeded",
            f"{result.probe}: {what} {measured} is over the budget {budget} = {limit}",
            detail=f"The gate's configuration allows {budget} = {limit}; this run measured {measured}.",
            evidence={"budget": budget, "limit": limit, "measured": measured, "probe": result.probe},
            fix="Fix the cause the probe's own findings name, or raise the budget in [tool.dflashdoctor] "
            "if the new figure is intended.",
        )
    )
    result.checks.append(Check(f"budget {budget}", "fail", f"{measured} > {limit}", ["budget-exceeded"]))


def apply_budgets(result: ProbeResult, config: GateConfig) -> None:
    m = result.measurements
    recompiles = m.get("recompiles")
    if isinstance(recompiles, int) and recompiles > config.max_recompiles:
        _over(result, "max_recompiles", recompiles, config.max_recompiles, "recompiles")
    breaks = m.get("graph_breaks")
    count = sum(breaks.values()) if isinstance(breaks, dict) else breaks
    if isinstance(count, int) and count > config.max_graph_breaks:
        _over(result, "max_graph_breaks", count, config.max_graph_breaks, "graph breaks")
    compile_s = m.get("compile_s")
    limit = config.max_compile_seconds
    if limit is not None and isinstance(compile_s, int | float) and compile_s > limit:
        _over(result, "max_compile_seconds", round(compile_s, 2), limit, "compile seconds")
    if not config.require_fused_backward:  # the team accepts a dense backward (say, a forward-only job)
        _allow(result, {"dense-backward"}, "info", "allowed (require_fused_backward = false)")


def _allow(result: ProbeResult, codes: set[str], status: CheckStatus, why: str) -> None:
    """The configuration accepts what `codes` stand for: their findings go, and a failed check that
    stood for them (and for no error still found) becomes `status`, saying why."""
    result.findings = [f for f in result.findings if f.code not in codes]
    still_errors = {f.code for f in result.findings if f.severity == "error"}
    for check in result.checks:
        if check.status == "fail" and set(check.codes) & codes and not set(check.codes) & still_errors:
            check.status, check.summary = status, f"{why}: {check.summary}"


def judge_race_for_pipeline(result: ProbeResult, config: GateConfig) -> None:
    if config.threaded_autotuners:
        result.checks.append(Check("pipeline", "info", "threaded_autotuners = true: the race is this pipeline's error"))
        return
    reproduction = [f for f in result.findings if f.code in _RACE_ERRORS]
    if not reproduction:
        return
    _allow(result, set(_RACE_ERRORS), "warn", "installed triton is racy")
    shared = next((f for f in result.findings if f.code == "autotuner-shared-state"), None)
    if shared is not None:
        shared.evidence["forced_reproduction"] = [f"{f.code}: {f.title}" for f in reproduction]
        shared.detail += (
            " The forced reproduction failed here, so the installed triton has the race; the configured pipeline "
            "does not run autotuned kernels from several threads (threaded_autotuners = false), so it is a warning."
        )
    result.checks.append(Check("pipeline", "info", "threaded_autotuners = false: the race is reported as a warning"))


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
