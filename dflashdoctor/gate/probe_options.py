"""The gate's configuration as each probe's own options: the one place that knows both, so that no
command module knows the gate (and the gate's configuration knows no command's internals)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflashdoctor.commands.cache import CacheOptions
from dflashdoctor.commands.check_compile import CheckCompileOptions
from dflashdoctor.commands.env import EnvOptions
from dflashdoctor.commands.race import RaceOptions
from dflashdoctor.commands.trace_attention import TraceAttentionOptions
from dflashdoctor.gate.config import GATE_PROBES, GateConfig


def _env(_config: GateConfig, python: str | None, ssh: str | None) -> EnvOptions:
    return EnvOptions(python=python, ssh=ssh)  # its own short timeout: it imports torch and reads versions


def _check_compile(config: GateConfig, python: str | None, ssh: str | None) -> CheckCompileOptions:
    return CheckCompileOptions(
        target=config.target,
        device=config.device,
        shape=config.shape,
        mask=config.mask,
        vary=config.vary,
        max_recompiles=config.max_recompiles,
        python=python,
        ssh=ssh,
        timeout_s=config.timeout,
    )


def _trace_attention(config: GateConfig, python: str | None, ssh: str | None) -> TraceAttentionOptions:
    """The team's step script, else the configured model, else the reference drafter step."""
    return TraceAttentionOptions(
        model=config.model,
        script=config.script,
        drafter=config.model is None and config.script is None,
        expect_wrapper=config.expect_wrapper,
        device=config.device,
        python=python,
        ssh=ssh,
        timeout_s=config.timeout,
    )


def _race(config: GateConfig, python: str | None, ssh: str | None) -> RaceOptions:
    return RaceOptions(python=python, ssh=ssh, timeout_s=config.timeout)


def _cache(config: GateConfig, python: str | None, ssh: str | None) -> CacheOptions:
    return CacheOptions(
        "check",
        Path(config.triton_dir) if config.triton_dir else None,
        Path(config.inductor_dir) if config.inductor_dir else None,
        python=python,
        ssh=ssh,
    )


OPTIONS_FROM_GATE: dict[str, Callable[[GateConfig, str | None, str | None], Any]] = {
    "env": _env,
    "check-compile": _check_compile,
    "trace-attention": _trace_attention,
    "race": _race,
    "cache": _cache,
}
assert tuple(OPTIONS_FROM_GATE) == GATE_PROBES, "every probe the gate runs needs its options from the gate"
