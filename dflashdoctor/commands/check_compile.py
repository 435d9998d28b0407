"""`check-compile`: its options, what is bad input before a probe starts, and the probe's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.check_compile import judge
from dflashdoctor.limits import MAX_VARY, count_problem
from dflashdoctor.observations import CheckCompileObservations
from dflashdoctor.options import cli
from dflashdoctor.probe_configs import CheckCompileConfig
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.reference import DEFAULT_TARGET
from dflashdoctor.session import PROBE_TIMEOUT_S
from dflashdoctor.shapes import (
    DEVICES,
    DTYPES,
    FIELD_TYPES,
    MASKS,
    OPTION_FIELDS,
    default_shape,
    shape_problem,
    shape_with,
)


def _defaults(name: str) -> str:
    """An option's defaults, read from the device shapes."""
    cuda, cpu = getattr(default_shape("cuda"), name), getattr(default_shape("cpu"), name)
    return f"[{cuda}]" if cuda == cpu else f"[cuda {cuda}, cpu {cpu}]"


# --batch ... --dtype: AttentionShape's option fields, with their help and the devices' defaults
SHAPE_OPTIONS = tuple((f.name, FIELD_TYPES[f.name], f"{f.metadata['help']} {_defaults(f.name)}") for f in OPTION_FIELDS)


@dataclass
class CheckCompileOptions:
    target: str = field(
        default=DEFAULT_TARGET, metadata=cli("package.module:attr or path/to/file.py:attr", argument=True)
    )
    device: str = field(default="auto", metadata=cli("auto, cpu or cuda"))
    # AttentionShape's fields; one unset (None) takes the device's default
    shape: dict[str, Any] = field(default_factory=dict, metadata=cli("", group=SHAPE_OPTIONS))
    mask: str = field(default="dflash", metadata=cli("dflash, causal or none"))
    vary: int = field(default=10, metadata=cli("Also call with this many growing context lengths."))
    max_recompiles: int = field(default=Budgets.max_recompiles, metadata=cli("Recompiles allowed before a warning."))
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


def probe_config(options: CheckCompileOptions) -> CheckCompileConfig:
    known = {f.name for f in OPTION_FIELDS}
    return CheckCompileConfig(
        target=options.target,
        device=options.device,
        shape={k: v for k, v in options.shape.items() if k in known and v is not None},
        mask=options.mask,
        vary=options.vary,
    )


def subject(options: CheckCompileOptions) -> dict[str, str]:
    return {"target": options.target, "requested_device": options.device}


def budgets(options: CheckCompileOptions) -> Budgets:
    """Alone, the defaults with --max-recompiles; the gate passes its own."""
    return Budgets(max_recompiles=options.max_recompiles)


SPEC = ProbeSpec(
    name="check-compile",
    summary="Is this flex_attention wrapper really compiled, and are forward and backward fused?",
    options=CheckCompileOptions,
    observations=CheckCompileObservations,
    judge=judge,
    script="check_compile.py",
    probe_config=probe_config,
    validate=validate,
    subject=subject,
    budgets=budgets,
    forked_in_gate=True,
)
