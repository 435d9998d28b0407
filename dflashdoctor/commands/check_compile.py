"""`check-compile`: run the check-compile probe in a child process and judge what it saw."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.check_compile import judge
from dflashdoctor.limits import MAX_VARY, count_problem
from dflashdoctor.observations import CheckCompileObservations
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.reference import DEFAULT_TARGET
from dflashdoctor.report import Report
from dflashdoctor.session import PROBE_TIMEOUT_S, finish, new_report, probe_into_report, probe_python
from dflashdoctor.shapes import DEVICES, DTYPES, MASKS, AttentionShape, shape_problem, shape_with

if TYPE_CHECKING:
    from dflashdoctor.gate.config import GateConfig


@dataclass
class CheckCompileOptions:
    target: str = DEFAULT_TARGET
    device: str = "auto"
    shape: dict[str, Any] = field(default_factory=dict)  # AttentionShape fields; None = device default
    mask: str = "dflash"
    vary: int = 10
    max_recompiles: int = Budgets.max_recompiles
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    timeout_s: float = PROBE_TIMEOUT_S


def validate(options: CheckCompileOptions) -> None:
    """What can be judged before a probe starts; the probe checks the rest (imports, CUDA)."""
    if options.device not in DEVICES:
        raise BadInput(f"unknown device {options.device!r}; expected one of {', '.join(DEVICES)}")
    if options.mask not in MASKS:
        raise BadInput(f"unknown mask {options.mask!r}; expected one of {', '.join(MASKS)}")
    dtype = options.shape.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise BadInput(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if ":" not in options.target:
        raise BadInput(f"target {options.target!r} is not of the form package.module:attr or path/to/file.py:attr")
    if options.device != "auto":  # for auto the probe checks, once it knows the device's defaults
        problem = shape_problem(shape_with(options.device, options.shape), options.mask)
        if problem:
            raise BadInput(problem)
    problem = count_problem(options.vary, "--vary", 0, MAX_VARY) or count_problem(
        options.max_recompiles, "--max-recompiles", 0
    )
    if problem:
        raise BadInput(problem)


def probe_config(options: CheckCompileOptions) -> dict[str, Any]:
    known = set(AttentionShape.__dataclass_fields__)
    return {
        "target": options.target,
        "device": options.device,
        "shape": {k: v for k, v in options.shape.items() if k in known and v is not None},
        "mask": options.mask,
        "vary": options.vary,
    }


def check_compile(options: CheckCompileOptions, argv: list[str], budgets: Budgets | None = None) -> Report:
    """`budgets`: the gate's; alone, the defaults with --max-recompiles."""
    validate(options)
    python = probe_python(options.python, options.ssh)
    started = time.monotonic()
    report = new_report("check-compile", argv)
    report.environment.update(target=options.target, requested_device=options.device)
    probe_into_report(
        report,
        SPEC,
        probe_config(options),
        python=python,
        timeout_s=options.timeout_s,
        budgets=budgets or Budgets(max_recompiles=options.max_recompiles),
        ssh=options.ssh,
    )
    return finish(report, started)


def from_gate(config: GateConfig, python: str | None, ssh: str | None) -> CheckCompileOptions:
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


SPEC = ProbeSpec(
    name="check-compile",
    options=CheckCompileOptions,
    observations=CheckCompileObservations,
    judge=judge,
    command=check_compile,
    script="check_compile.py",
    from_gate=from_gate,
    forked_in_gate=True,
)
