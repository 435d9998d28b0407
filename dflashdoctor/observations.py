"""What each probe reports, typed: the one shape the probed side writes and the judges read.

A probe builds its observations as plain JSON (it may run in another interpreter, over ssh); the
doctor side loads them with `load`, which turns nested dicts into these dataclasses by their type
hints. A key this version does not know is ignored and a missing one takes its default, so an
`observations.json` kept from another version still loads. Standard library only, and nothing of
the doctor side: the probed side imports `DenseEvent` from here. The observations of the two
commands that run on the doctor's side (`cache`, `run`) are kept beside them (cache/observations.py,
runs/observations.py).
"""

from __future__ import annotations

import sys
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")


class ObservationsError(ValueError):
    """Observations that do not have the shape their probe writes (a damaged or foreign file)."""


@dataclass
class DenseEvent:
    """One execution of a dense flex_attention kernel: what it computed and who asked for it."""

    kind: str  # "forward" or "backward"
    phase: str
    q_shape: list[int]
    kv_shape: list[int]
    dtype: str
    device: str
    score_matrix_bytes: int
    site: dict[str, Any] | None
    stack: list[str] = field(default_factory=list)
    thread: str = ""
    forward_site: dict[str, Any] | None = None  # the forward call site it was charged to, if any
    peak_bytes: int | None = None  # CUDA memory the kernel added at its peak, when measured
    # How flex_attention reached its dense kernel, read off the stack (flex_dense.ROUTES); a
    # backward takes its forward's. None: the stack had none of the frames that tell.
    route: str | None = None
    layer: str | None = None  # the dotted nn.Module name that made the call, when the recorder names modules
    # The blocks (expect_fused, record) this call is older work than: its thread was running the
    # same work when they opened (flex_dense.DenseFlexRecorder.watch_older_work). Not written out.
    older_than: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("older_than")
        return data


@dataclass
class GraphBreakSite:
    """Identical graph breaks, grouped: dynamo's reason, where it broke and how it got there
    (hooks/dynamo_watch.py). Frames are `file:line in function`; `site` is the innermost one
    outside torch and dflashdoctor (the line to change, or the library line that called into
    torch), `entry` the outermost such frame: where dynamo began tracing toward the break."""

    reason: str
    count: int
    site: str | None = None
    broke_at: str | None = None  # the frame dynamo broke in, torch's own included
    entry: str | None = None
    stack: list[str] = field(default_factory=list)  # dynamo's user stack, outermost first (the innermost kept)


@dataclass
class VaryCall:
    """check-compile: the target at one more context length."""

    kv_len: int
    dense_forward: int = 0
    dense_backward: int = 0
    forward_s: float | None = None
    compiles: int = 0


@dataclass
class CheckCompileObservations:
    device: str = "cpu"
    device_name: str = "cpu"
    torch: str | None = None
    python: str | None = None
    shape: dict[str, Any] = field(default_factory=dict)  # AttentionShape's fields
    mask: str = "dflash"
    backward_checked: bool = False
    target: dict[str, Any] = field(default_factory=dict)  # targets.TargetInfo
    hook_unavailable: str | None = None
    dynamo_watch_unavailable: str | None = None
    recompile_limit: int | None = None
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # "target:first", "eager:backward", ...
    numerics: dict[str, Any] = field(default_factory=dict)
    vary: list[VaryCall] = field(default_factory=list)
    dense_events: list[DenseEvent] = field(default_factory=list)
    compiles: list[dict[str, Any]] = field(default_factory=list)
    graph_breaks: dict[str, int] = field(default_factory=dict)
    graph_break_sites: list[GraphBreakSite] = field(default_factory=list)
    oom: list[dict[str, Any]] = field(default_factory=list)  # one record per phase that ran out of memory
    target_error: dict[str, Any] | None = None
    import_s: float | None = None
    setup_s: float | None = None


@dataclass
class TraceAttentionObservations:
    """The traced parts (a model preset, the reference drafter, a script) each keep their own
    record of sites; the dense kernels, compiles and graph breaks are the whole run's."""

    device: str = "cpu"
    torch: str | None = None
    python: str | None = None
    transformers: str | None = None
    expect_wrapper: str | None = None
    traced_model: dict[str, Any] | None = None
    traced_drafter: dict[str, Any] | None = None
    traced_script: dict[str, Any] | None = None
    compiles: list[dict[str, Any]] = field(default_factory=list)
    graph_breaks: dict[str, int] = field(default_factory=dict)
    graph_break_sites: list[GraphBreakSite] = field(default_factory=list)
    dynamo_disabled: bool = False
    dense_events: list[DenseEvent] = field(default_factory=list)
    hook_unavailable: str | None = None

    def parts(self) -> list[dict[str, Any]]:
        return [p for p in (self.traced_model, self.traced_drafter, self.traced_script) if p]


@dataclass
class RaceObservations:
    """The stub kernel's trials (forced and natural), or a real kernel's (`kernel_trials`)."""

    python: str | None = None
    torch: str | None = None
    triton: str | None = None
    fla: str | None = None
    kernel: str = "stub"
    threads: int = 2
    fix: str = "none"
    audit: list[dict[str, Any]] = field(default_factory=list)  # autotune.audit.ClassAudit
    forced_unfixed: dict[str, Any] | None = None  # autotune.trials.Trial
    forced_fixed: dict[str, Any] | None = None
    natural: list[dict[str, Any]] = field(default_factory=list)
    processes: dict[str, Any] | None = None
    kernel_skipped: str | None = None
    live_autotuners: Any = None
    devices: list[str] = field(default_factory=list)
    reference: dict[str, Any] | None = None
    kernel_trials: list[dict[str, Any]] | None = None  # autotune.kernel_runs: each tuned cold


@dataclass
class EnvObservations:
    python: str | None = None
    executable: str | None = None
    platform: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    driver: str | None = None
    variables: dict[str, str] = field(default_factory=dict)
    cache_roots: list[dict[str, Any]] = field(default_factory=list)
    bytecode: dict[str, Any] = field(default_factory=dict)
    fla: dict[str, Any] | None = None
    torch: str | None = None
    import_torch_s: float | None = None
    cuda: str | None = None
    cudnn: int | str | None = None
    cuda_available: bool = False
    gpus: list[dict[str, Any]] = field(default_factory=list)
    recompile_limit: int | None = None
    dynamo_disabled: bool | None = None


@dataclass
class BlockObservations:
    """`dflashdoctor.testing`: what one block of a user's own test saw, every thread counted.
    `earlier_compiles` are dynamo's records from before the block, kept when the block ran a dense
    kernel: a fallback from then still explains a dense call made in it."""

    dense_events: list[DenseEvent] = field(default_factory=list)
    dense_dropped: int = 0  # counted but no longer kept (past the hook's bound)
    compiles: list[dict[str, Any]] = field(default_factory=list)
    earlier_compiles: list[dict[str, Any]] = field(default_factory=list)
    autotuner_overlaps: list[dict[str, Any]] = field(default_factory=list)  # hooks.autotuner_guard.ConcurrentEntry
    dynamo_disabled: bool = False
    recompile_limit: int | None = None
    unavailable: list[str] = field(default_factory=list)


def load(cls: type[T], data: Any) -> T:
    """`cls` (a dataclass) from its JSON form, nested dataclasses included."""
    if not isinstance(data, dict):
        raise ObservationsError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    values = {f.name: _typed(hints[f.name], data[f.name]) for f in fields(cls) if f.name in data}  # type: ignore[arg-type]
    missing = [
        f.name
        for f in fields(cls)  # type: ignore[arg-type]
        if f.name not in values and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ObservationsError(f"{cls.__name__}: missing {', '.join(missing)}")
    return cls(**values)


def _typed(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and is_dataclass(hint):
        return load(hint, value)
    if origin is list and isinstance(value, list) and args:
        return [_typed(args[0], item) for item in value]
    if origin is tuple and isinstance(value, list | tuple) and len(args) == len(value):
        return tuple(_typed(arg, item) for arg, item in zip(args, value, strict=True))
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        for arg in args:  # the first dataclass member that fits a dict; anything else as it came
            if isinstance(arg, type) and is_dataclass(arg) and isinstance(value, dict):
                return load(arg, value)
    return value


def dump(observations: Any) -> dict[str, Any]:
    """The JSON form `load` reads back."""
    return asdict(observations)
