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

import functools
import sys
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar, cast

from dflashdoctor.records import (
    BytecodeRecord,
    CacheRootRecord,
    ClassAuditRecord,
    CompileRecord,
    ConcurrentEntryRecord,
    DenseEventRecord,
    DeviceMemory,
    FixReplayRecord,
    FlaState,
    GpuRecord,
    KernelTrialRecord,
    LiveAutotuner,
    Numerics,
    OomRecord,
    PackageRecord,
    PhaseRecord,
    ProcessesRecord,
    ReferenceTarget,
    SourceSite,
    TargetError,
    TargetRecord,
    TracedDrafter,
    TracedModel,
    TracedScript,
    TrialRecord,
)
from dflashdoctor.shapes import AttentionShape

T = TypeVar("T")


NOT_WRITTEN = {"written": False}  # a field's metadata: the process's own state, never in the JSON


def _written(cls: Any) -> list[Any]:
    return [f for f in fields(cls) if f.metadata.get("written", True)]


def not_written(cls: Any) -> frozenset[str]:
    """The fields `dump` leaves out, for a writer that serialises `vars()` itself on a hot path."""
    return frozenset(f.name for f in fields(cls) if not f.metadata.get("written", True))


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
    site: SourceSite | None
    stack: list[str] = field(default_factory=list)
    thread: str = ""
    forward_site: SourceSite | None = None  # the forward call site it was charged to, if any
    peak_bytes: int | None = None  # CUDA memory the kernel added at its peak, when measured
    # How flex_attention reached its dense kernel, read off the stack (flex_dense.ROUTES); a
    # backward takes its forward's. None: the stack had none of the frames that tell.
    route: str | None = None
    # `file:line in name` of the torch.compiler.disable'd function that called flex_attention (route "disabled")
    disabled_at: str | None = None
    # `file:line in name` of the function reentrant checkpointing was recomputing when flex ran dense
    recomputed: str | None = None
    stance: str | None = None  # torch.compiler.set_stance's stance at the call, when not "default"
    stance_set_at: str | None = None  # `file:line` of the user's set_stance call, when recorded
    layer: str | None = None  # the dotted nn.Module name that made the call, when the recorder names modules
    # The blocks (expect_fused, record) this call is older work than: its thread was running the
    # same work when they opened (flex_dense.DenseFlexRecorder.watch_older_work). Not written out.
    older_than: tuple[int, ...] = field(default=(), repr=False, compare=False, metadata=NOT_WRITTEN)

    def to_dict(self) -> dict[str, Any]:
        written: dict[str, Any] = dump(self)
        return written

    def to_record(self) -> DenseEventRecord:
        """As a record keeps it (an out-of-memory's last dense kernels): `dump` writes exactly the
        record's keys (tests/unit/test_records.py holds the two together)."""
        return cast(DenseEventRecord, dump(self))


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
    shape: AttentionShape = field(kw_only=True)  # what the target was called at; no default to judge
    mask: str = "dflash"
    backward_checked: bool = False
    target: TargetRecord = field(default_factory=dict)  # type: ignore[assignment]
    hook_unavailable: str | None = None
    dynamo_watch_unavailable: str | None = None
    recompile_limit: int | None = None
    phases: dict[str, PhaseRecord] = field(default_factory=dict)  # keyed by probes/check_compile's PHASES
    numerics: Numerics = field(default_factory=dict)  # type: ignore[assignment]
    vary: list[VaryCall] = field(default_factory=list)
    dense_events: list[DenseEvent] = field(default_factory=list)
    compiles: list[CompileRecord] = field(default_factory=list)
    graph_breaks: dict[str, int] = field(default_factory=dict)
    graph_break_sites: list[GraphBreakSite] = field(default_factory=list)
    oom: list[OomRecord] = field(default_factory=list)  # one record per phase that ran out of memory
    target_error: TargetError | None = None
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
    traced_model: TracedModel | None = None
    traced_drafter: TracedDrafter | None = None
    traced_script: TracedScript | None = None
    compiles: list[CompileRecord] = field(default_factory=list)
    graph_breaks: dict[str, int] = field(default_factory=dict)
    graph_break_sites: list[GraphBreakSite] = field(default_factory=list)
    dynamo_disabled: bool = False
    dense_events: list[DenseEvent] = field(default_factory=list)
    hook_unavailable: str | None = None
    # Each dense site's call replayed through torch.compile(flex_attention) after the run
    # (hooks/fix_replay.py). None: nothing was replayed (`run`, or a version before the replay).
    fix_replays: list[FixReplayRecord] | None = None

    def parts(self) -> list[TracedModel | TracedDrafter | TracedScript]:
        return [p for p in (self.traced_model, self.traced_drafter, self.traced_script) if p]


@dataclass
class RunSnapshot(TraceAttentionObservations):
    """`run`: one process's trace-attention observations so far, as the agent snapshots them
    (agent/torch_instruments), with what only a whole run has. The run judge reads the last one."""

    dense_events_total: int = 0  # every dense kernel seen; `dense_events` keeps the last ones
    steps: int = 0  # optimizer steps
    memory: dict[str, DeviceMemory] = field(default_factory=dict)  # by device, now
    autotuner_overlaps: list[ConcurrentEntryRecord] = field(default_factory=list)
    autotuned_kernels: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)  # instrumentation that could not be installed


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
    audit: list[ClassAuditRecord] = field(default_factory=list)
    forced_unfixed: TrialRecord | None = None
    forced_fixed: TrialRecord | None = None
    natural: list[TrialRecord] = field(default_factory=list)
    processes: ProcessesRecord | None = None
    kernel_skipped: str | None = None
    live_autotuners: list[LiveAutotuner] | None = None
    devices: list[str] = field(default_factory=list)
    reference: ReferenceTarget | None = None
    kernel_trials: list[KernelTrialRecord] | None = None  # autotune.kernel_runs: each tuned cold


@dataclass
class EnvObservations:
    python: str | None = None
    executable: str | None = None
    platform: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    driver: str | None = None
    variables: dict[str, str] = field(default_factory=dict)
    cache_roots: list[CacheRootRecord] = field(default_factory=list)
    bytecode: BytecodeRecord = field(default_factory=dict)  # type: ignore[assignment]
    fla: FlaState | None = None
    torch: str | None = None
    import_torch_s: float | None = None
    cuda: str | None = None
    cudnn: int | str | None = None
    cuda_available: bool = False
    gpus: list[GpuRecord] = field(default_factory=list)
    recompile_limit: int | None = None
    dynamo_disabled: bool | None = None


@dataclass
class VersionsObservations:
    """The stack's installed distributions and their requirements on each other (probes/versions.py)."""

    python: str | None = None
    packaging: str | None = None  # the version that read the requirements; None: none could
    packages: list[PackageRecord] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)  # a distribution -> why its metadata cannot be read


@dataclass
class BlockObservations:
    """`dflashdoctor.testing`: what one block of a user's own test saw, every thread counted.
    `earlier_compiles` are dynamo's records from before the block, kept when the block ran a dense
    kernel: a fallback from then still explains a dense call made in it."""

    dense_events: list[DenseEvent] = field(default_factory=list)
    dense_dropped: int = 0  # counted but no longer kept (past the hook's bound)
    compiles: list[CompileRecord] = field(default_factory=list)
    earlier_compiles: list[CompileRecord] = field(default_factory=list)
    autotuner_overlaps: list[ConcurrentEntryRecord] = field(default_factory=list)
    dynamo_disabled: bool = False
    recompile_limit: int | None = None
    unavailable: list[str] = field(default_factory=list)


def load(cls: type[T], data: Any, *, strict: bool = False) -> T:
    """`cls` (a dataclass) from its JSON form, nested dataclasses included.

    `strict` (what the probes of this version write, and every recording the tests read): a key
    `cls` does not know, a key it has that is missing, or a value of another type than its hint,
    at any depth (the records of records.py included), is an ObservationsError naming where. A
    probe that renames a key then fails its tests instead of being judged on a default. Not strict
    (an `observations.json` kept from another version): unknown keys are ignored, missing fields
    take their defaults, and records are taken as they are."""
    return _load(cls, data, strict, cls.__name__)


def check_record(record_type: Any, value: Any, where: str) -> None:
    """`value` against a records.py TypedDict by load's strict rules, for a record read on its own
    (a `run` event line): an ObservationsError naming where it differs."""
    _record(record_type, value, True, where)


_SHAPES: dict[type, tuple[dict[str, Any], list[Any]]] = {}


def _dataclass_shape(cls: type) -> tuple[dict[str, Any], list[Any]]:
    """A dataclass's resolved hints and written fields, worked out once per class: resolving the
    string annotations was most of the time `run` spent reading a long run's snapshot lines."""
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = typing.get_type_hints(cls, vars(sys.modules[cls.__module__])), _written(cls)
    return shape


@functools.cache
def _record_shape(hint: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """A TypedDict's key hints (a NotRequired key's unwrapped) and its optional keys, once per type."""
    hints = typing.get_type_hints(hint, vars(sys.modules[hint.__module__]), include_extras=True)
    optional = frozenset(k for k, h in hints.items() if typing.get_origin(h) is typing.NotRequired)
    return {k: typing.get_args(h)[0] if k in optional else h for k, h in hints.items()}, optional


def _load(cls: type[T], data: Any, strict: bool, where: str) -> T:
    if not isinstance(data, dict):
        raise ObservationsError(f"{where}: expected an object, got {type(data).__name__}")
    hints, known = _dataclass_shape(cls)
    if strict:
        _exact_keys(where, set(data), {f.name for f in known}, {f.name for f in known})
    values = {f.name: _typed(hints[f.name], data[f.name], strict, f"{where}.{f.name}") for f in known if f.name in data}
    missing = [f.name for f in known if f.name not in values and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ObservationsError(f"{where}: missing {', '.join(missing)}")
    return cls(**values)


def _exact_keys(where: str, given: set[Any], known: set[str], required: set[str]) -> None:
    unknown = sorted(map(str, given - known))
    if unknown:
        raise ObservationsError(f"{where}: unknown key {', '.join(map(repr, unknown))}")
    missing = sorted(required - given)
    if missing:
        raise ObservationsError(f"{where}: missing {', '.join(map(repr, missing))}")


def _record(hint: Any, value: Any, strict: bool, where: str) -> Any:
    """A records.py TypedDict: checked key by key when strict (its NotRequired keys may be absent),
    taken as it is otherwise."""
    if not strict:
        return value
    if not isinstance(value, dict):
        raise ObservationsError(f"{where}: expected an object, got {type(value).__name__}")
    hints, optional = _record_shape(hint)
    _exact_keys(where, set(value), set(hints), set(hints) - optional)
    for key, item in value.items():
        _typed(hints[key], item, strict, f"{where}[{key!r}]")
    return value


_SCALARS: dict[type, tuple[type, ...]] = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def _typed(hint: Any, value: Any, strict: bool, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and is_dataclass(hint):
        return _load(hint, value, strict, where)
    if typing.is_typeddict(hint):
        return _record(hint, value, strict, where)
    if origin is list and isinstance(value, list) and args:
        return [_typed(args[0], item, strict, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict and isinstance(value, dict) and args:
        return {key: _typed(args[1], item, strict, f"{where}[{key!r}]") for key, item in value.items()}
    if origin is tuple and isinstance(value, list | tuple) and len(args) == len(value):
        return tuple(
            _typed(arg, item, strict, f"{where}[{i}]") for i, (arg, item) in enumerate(zip(args, value, strict=True))
        )
    if origin in (typing.Union, types.UnionType):
        return _union(args, value, strict, where)
    if strict:
        _check_scalar(hint, origin, value, where)
    return value


def _union(args: tuple[Any, ...], value: Any, strict: bool, where: str) -> Any:
    if value is None and type(None) in args:
        return None
    problems = []
    for arg in args:  # the first member that fits; not strict: the first dataclass that fits a dict
        if arg is type(None):
            continue
        if not strict and not (isinstance(arg, type) and is_dataclass(arg) and isinstance(value, dict)):
            continue
        try:
            return _typed(arg, value, strict, where)
        except ObservationsError as exc:
            problems.append(str(exc))
    if strict:
        raise ObservationsError(problems[0] if len(problems) == 1 else f"{where}: fits none of {args}")
    return value


def _check_scalar(hint: Any, origin: Any, value: Any, where: str) -> None:
    """A value against a plain hint: its type (a bool is no number), or the container it names."""
    if hint is Any:
        return
    expected = _SCALARS.get(hint) or ((origin,) if origin in (list, dict, tuple) else None)
    if hint is type(None):
        expected = (type(None),)
    if expected is None:
        return
    if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
        raise ObservationsError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}")


def dump(observations: Any) -> Any:
    """The JSON form `load` reads back (a dataclass's fields but those NOT_WRITTEN, at any depth)."""
    if is_dataclass(observations) and not isinstance(observations, type):
        return {f.name: dump(getattr(observations, f.name)) for f in _written(observations)}
    if isinstance(observations, list | tuple):
        return [dump(item) for item in observations]
    if isinstance(observations, dict):
        return {key: dump(value) for key, value in observations.items()}
    return observations
