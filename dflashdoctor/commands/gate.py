"""`gate`: env, check-compile, trace-attention, the race checks and cache check as one report, judged
against the configured budgets. Each probe's result is a section (a JUnit testsuite, SARIF results).

The probes run at once by default (each is its own process; most of a probe's time is starting
Python and importing torch); `parallel = false` runs them one after another, for timings taken on
an otherwise idle machine (check-compile's compile and call times share the GPU and CPUs otherwise)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashdoctor.commands.cache import CacheOptions, cache
from dflashdoctor.commands.check_compile import CheckCompileOptions, check_compile
from dflashdoctor.commands.env import EnvOptions, env
from dflashdoctor.commands.race import RaceOptions, race
from dflashdoctor.commands.trace_attention import TraceAttentionOptions, trace_attention
from dflashdoctor.errors import MissingPackage
from dflashdoctor.gate.config import GateConfig, load_config
from dflashdoctor.gate.verdicts import apply_budgets, drop_repeated_findings, judge_race_for_pipeline
from dflashdoctor.report import Check, ProbeResult, Report
from dflashdoctor.session import finish, new_report


@dataclass
class GateOptions:
    config: Path | None = None
    cwd: Path = Path(".")
    target: str | None = None  # overrides the configuration
    device: str | None = None
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there


def _probe(name: str, config: GateConfig, python: str | None, ssh: str | None) -> Report:
    """One probe's own report, run as its command would run it."""
    argv = ["dflashdoctor", "gate", name]
    if name == "cache" and ssh is not None:
        return _skipped(argv, name, "cache check reads files on this machine; run `dflashdoctor cache check` there")
    # where and how long each probe runs (env keeps its own short timeout)
    probed_side: dict[str, Any] = {"python": python, "ssh": ssh, "timeout_s": config.timeout}
    runners: dict[str, Callable[[], Report]] = {
        "env": lambda: env(EnvOptions(python=python, ssh=ssh), argv),
        "check-compile": lambda: check_compile(
            CheckCompileOptions(
                target=config.target,
                device=config.device,
                shape=config.shape,
                mask=config.mask,
                vary=config.vary,
                max_recompiles=config.max_recompiles,
                **probed_side,
            ),
            argv,
        ),
        "trace-attention": lambda: trace_attention(
            TraceAttentionOptions(
                model=config.model,
                drafter=config.model is None,
                expect_wrapper=config.expect_wrapper,
                device=config.device,
                **probed_side,
            ),
            argv,
        ),
        "race": lambda: race(RaceOptions(**probed_side), argv),
        "cache": lambda: cache(
            CacheOptions(
                "check",
                Path(config.triton_dir) if config.triton_dir else None,
                Path(config.inductor_dir) if config.inductor_dir else None,
            ),
            argv,
        ),
    }
    try:
        return runners[name]()
    except MissingPackage as exc:
        if (name, exc.package) != ("race", "triton"):
            raise
        return _skipped(argv, name, "triton is not installed in the probed interpreter: no triton autotuner to race")


def _skipped(argv: list[str], probe: str, why: str) -> Report:
    """A section for a probe that does not apply here: shown, with why, and never a failure."""
    report = new_report("gate", argv)
    report.results.append(ProbeResult(probe=probe, status="skipped", checks=[Check(probe, "skip", why)]))
    return report


def gate(options: GateOptions, argv: list[str]) -> Report:
    config, source = load_config(options.config, options.cwd)
    if options.target:
        config.target = options.target
    if options.device:
        config.device = options.device
    config.validate()  # the overrides too, whichever probes run, before any starts
    started = time.monotonic()
    report = new_report("gate", argv)
    report.environment.update(target=config.target, gate_config=source)
    with ThreadPoolExecutor(max_workers=len(config.probes) if config.parallel else 1) as pool:
        reports = list(pool.map(lambda name: _probe(name, config, options.python, options.ssh), config.probes))
    for name, sub in zip(config.probes, reports, strict=True):
        for result in sub.results:
            if result.status == "skipped":  # nothing ran: no budget or pipeline verdict applies
                report.results.append(result)
                continue
            if name == "race":
                judge_race_for_pipeline(result, config)
            if name in ("check-compile", "trace-attention"):
                apply_budgets(result, config)
            report.results.append(result)
        for key, value in sub.environment.items():
            report.environment.setdefault(key, value)
    drop_repeated_findings(report.results)
    return finish(report, started)
