"""`trace-attention`: every attention call site of a model, through which implementation, fused or dense."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dflashdoctor.errors import BadInput
from dflashdoctor.judges.trace_attention import judge
from dflashdoctor.limits import MAX_STEPS, count_problem
from dflashdoctor.models import SCALES, config_source, preset_names
from dflashdoctor.observations import TraceAttentionObservations
from dflashdoctor.options import cli
from dflashdoctor.probe_configs import TraceAttentionConfig
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.reference import DRAFTER_FAULTS
from dflashdoctor.session import PROBE_TIMEOUT_S
from dflashdoctor.shapes import DEVICES

DEFAULT_MODEL = "qwen27b"
_SCRIPT_BYTES = 64 << 20  # a script larger than this is no training script


@dataclass
class TraceAttentionOptions:
    # None: DEFAULT_MODEL unless a script or the drafter is traced
    model: str | None = field(
        default=None, metadata=cli(f"Preset ({preset_names()}), a config.json, or a model folder [{DEFAULT_MODEL}]")
    )
    script: str | None = field(default=None, metadata=cli("A Python script to run as __main__ and trace"))
    script_args: list[str] = field(
        default_factory=list, metadata=cli("Arguments for --script, after --", argument=True)
    )
    expect_wrapper: str | None = field(
        default=None, metadata=cli("module:attr or file.py:attr every flex call should go through")
    )
    drafter: bool = field(default=False, metadata=cli("Also trace a reference DFlash drafter step"))
    drafter_fault: str | None = field(
        default=None, metadata=cli("Plant a fault in the drafter: hf-flex-path or eager-wrapper")
    )
    scale: str = field(default="auto", metadata=cli("tiny, full, or auto (tiny on CPU, full on CUDA)"))
    device: str = field(default="auto", metadata=cli("auto, cpu or cuda"))
    backward: bool | None = field(  # None: per part (a frozen target preset forward only, the rest both)
        default=None,
        metadata=cli(
            "Also run backward [the drafter and most models: yes; a frozen target such as qwen27b: no].",
            flag="--backward/--no-backward",
        ),
    )
    steps: int = field(default=1, metadata=cli("Training steps to trace."))
    seq_len: int = field(
        default=256, metadata=cli("Tokens per step; the drafter drafts a quarter as many (128 or more) over them.")
    )
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    timeout_s: float = PROBE_TIMEOUT_S


def _compiles(script: str) -> None:
    """A script that is not Python (bytes that are not in its encoding, a syntax error) is bad input,
    said before anything is traced, not a crash of the probe that would run it."""
    try:
        with open(script, "rb") as handle:
            compile(handle.read(_SCRIPT_BYTES), script, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise BadInput(f"{script} is not Python{line}: {exc.msg if isinstance(exc, SyntaxError) else exc}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {script}: {exc.strerror}") from None


def validate(options: TraceAttentionOptions) -> None:
    if options.device not in DEVICES:
        raise BadInput(f"unknown device {options.device!r}; expected one of {', '.join(DEVICES)}")
    if options.scale not in ("auto", *SCALES):
        raise BadInput(f"unknown scale {options.scale!r}; expected auto, {', '.join(SCALES)}")
    problem = count_problem(options.steps, "--steps", 1, MAX_STEPS) or count_problem(options.seq_len, "--seq-len", 1)
    if problem:
        raise BadInput(problem)
    if options.drafter_fault is not None and options.drafter_fault not in DRAFTER_FAULTS:
        raise BadInput(f"unknown drafter fault {options.drafter_fault!r}; expected one of {', '.join(DRAFTER_FAULTS)}")
    if options.drafter_fault is not None and not options.drafter:
        raise BadInput("--drafter-fault needs --drafter")
    if options.script is not None and not os.path.isfile(options.script):
        raise BadInput(f"no such script: {options.script}")
    if options.script is not None:
        _compiles(options.script)
    if options.expect_wrapper is not None and ":" not in options.expect_wrapper:
        raise BadInput(f"--expect-wrapper {options.expect_wrapper!r} is not of the form module:attr or file.py:attr")
    if options.model is not None:
        config_source(options.model)  # a spec that names no preset or readable config is bad input


def traced_model(options: TraceAttentionOptions) -> str | None:
    """The model preset traced: the one named, else the default when nothing else is traced."""
    if options.model is None and options.script is None and not options.drafter:
        return DEFAULT_MODEL
    return options.model


def probe_config(options: TraceAttentionOptions) -> TraceAttentionConfig:
    return TraceAttentionConfig(
        model=traced_model(options),
        scale=options.scale,
        device=options.device,
        backward=options.backward,
        steps=options.steps,
        seq_len=options.seq_len,
        script=options.script,
        script_args=options.script_args,
        expect_wrapper=options.expect_wrapper,
        drafter=options.drafter,
        drafter_fault=options.drafter_fault,
    )


def subject(options: TraceAttentionOptions) -> dict[str, str]:
    model = traced_model(options)
    traced = [f"model {model}"] if model else []
    traced += ["reference drafter" + (f" ({options.drafter_fault})" if options.drafter_fault else "")] * options.drafter
    traced += [f"script {options.script}"] if options.script else []
    return {"target": " + ".join(traced), "requested_device": options.device}


SPEC = ProbeSpec(
    name="trace-attention",
    summary="Where is every attention call of a model, through which implementation, fused or dense?",
    options=TraceAttentionOptions,
    observations=TraceAttentionObservations,
    judge=judge,
    script="trace_attention.py",
    probe_config=probe_config,
    validate=validate,
    subject=subject,
    forked_in_gate=True,
)
