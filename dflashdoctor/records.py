"""The records inside the probes' observations, typed: each is the JSON a probed-side object writes
(its `to_dict`), read by the judges by key. A `TypedDict` because they cross a process (and maybe a
machine) as JSON: the probe writes them, `observations.load` checks them against these classes
(strictly: an unknown key, a missing one or a value of another type is an error), and the judges
read them with a type checker's help. Where a probed-side dataclass writes the record (`TargetInfo`,
`Trial`, `ClassAudit`, `ConcurrentEntry`, `FlexSite`, `SiteRecord`, `FlaGuard`), a unit test holds
its fields to the keys here, so the two cannot drift.

Standard library only: both sides import it.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

# ---- shared by the probes ----


class SourceSite(TypedDict):
    """The user's line that made a call (a dense kernel's, a target's error)."""

    file: str | None
    line: int | None
    function: str | None
    module: NotRequired[str | None]


class CompileRecord(TypedDict):
    """One dynamo frame compile, from torch's CompilationMetrics (hooks/dynamo_watch.py)."""

    phase: str
    compile_id: str | None
    co_name: str | None
    co_filename: str | None
    co_firstlineno: int | None
    recompile_reason: str | None
    fail_type: str | None
    fail_reason: str | None
    fail_user_frame_filename: str | None
    fail_user_frame_lineno: int | None
    entire_frame_compile_time_s: float | None
    num_graph_breaks: int | None
    inductor_fx_local_cache_hit_count: int | None
    inductor_fx_local_cache_miss_count: int | None
    guard_file: str | None  # the whole path of the file a recompile reason points at


class ErrorRecord(TypedDict):
    """An exception the user's code raised, kept as text."""

    type: str
    message: str
    traceback: str


class FlaGuardRecord(TypedDict):
    """fla_guards.FlaGuard: one of FLA's own refusals, evaluated here."""

    file: str
    line: int
    function: str
    message: str
    flags: dict[str, bool]
    other_terms: list[str]
    applies: bool


class FlaState(TypedDict):
    """fla_guards.fla_state: FLA as a run on this device meets it."""

    version: str | None
    triton: str | None
    gpu: str | None
    platform: str
    device: str
    usable: bool
    guards: list[FlaGuardRecord]


# ---- check-compile ----


class CallPlanRecord(TypedDict):
    """call_plan.CallPlan.to_dict: how check-compile called the target."""

    text: str
    signature: str | None  # None: nothing to inspect (a C callable)
    mask: str | None
    mask_name: str | None
    defaults: list[str]
    enable_gqa: bool | None  # None: not passed
    expand_kv: int


class BoundName(TypedDict):
    """Where a module binds a name (a rebound wrapper, the attribute's assignment)."""

    name: str
    file: str | None
    line: int | None
    module: str


class TargetRecord(TypedDict):
    """targets.TargetInfo: what static inspection learned about the target before calling it."""

    spec: str
    kind: str
    qualname: str
    module: str | None
    file: str | None
    line: int | None
    wraps: str | None
    compiled_globals: list[str]
    backends: dict[str, str]
    raw_flex_globals: list[str]
    rebound: BoundName | None
    assigned: BoundName | None
    call: CallPlanRecord | None


class Phase:
    """check-compile's phase names: the keys of `phases`, and the `phase` of each compile and dense
    kernel. The probe names its phases with these and the judge reads them back with them."""

    FIRST = "target:first"  # the first call: compiles included
    EAGER = "eager"  # flex_attention itself, uncompiled: the dense baseline
    NUMERICS = "numerics"  # the target on fresh inputs, compared with...
    REFERENCE = "reference"  # ...the target run eagerly in float32
    TARGET = ("target:", NUMERICS, "vary:")  # prefixes of the phases that call the target
    _BACKWARD = ":backward"

    @staticmethod
    def warm(index: int) -> str:
        return f"target:warm{index}"

    @staticmethod
    def vary(kv_len: int) -> str:
        return f"vary:{kv_len}"

    @staticmethod
    def backward(phase: str) -> str:
        return phase + Phase._BACKWARD

    @staticmethod
    def is_backward(phase: str) -> bool:
        return phase.endswith(Phase._BACKWARD)

    @staticmethod
    def is_warm(phase: str) -> bool:
        return phase.removesuffix(Phase._BACKWARD).removeprefix("target:warm").isdigit()

    @staticmethod
    def calls_target(phase: str) -> bool:
        return phase.startswith(Phase.TARGET)


class PhaseRecord(TypedDict):
    """One labelled stretch of check-compile (`target:first`, `eager:backward`, `vary:1360`, ...)."""

    wall_s: float
    peak_bytes: int | None
    compiles: list[CompileRecord]
    forward_s: NotRequired[float]  # a call's phases; not one that ran out of memory
    backward_s: NotRequired[float]
    oom: NotRequired[bool]
    warm_forward_median_s: NotRequired[float | None]  # `target:first` only


class Numerics(TypedDict):
    """The target against itself run eagerly in float32; the errors only for what ran (nothing when
    the target raised first)."""

    reference: NotRequired[str]
    out_rel_err: NotRequired[float]
    dq_rel_err: NotRequired[float]
    dk_rel_err: NotRequired[float]
    dv_rel_err: NotRequired[float]


class DenseEventRecord(TypedDict):
    """observations.DenseEvent.to_dict, where a record keeps events as written (an OOM's last ones)."""

    kind: str
    phase: str
    q_shape: list[int]
    kv_shape: list[int]
    dtype: str
    device: str
    score_matrix_bytes: int
    site: SourceSite | None
    stack: list[str]
    thread: str
    forward_site: SourceSite | None
    peak_bytes: int | None
    route: str | None
    disabled_at: str | None
    recomputed: str | None
    stance: str | None
    stance_set_at: str | None
    layer: str | None


class OomRecord(TypedDict):
    """A phase that ran out of memory, with what the allocator held (CUDA) and the last dense kernels."""

    phase: str
    message: str
    last_dense_events: list[DenseEventRecord]
    allocated_bytes: NotRequired[int]
    reserved_bytes: NotRequired[int]


class TargetError(TypedDict):
    """What the target raised, in which phase, from which of the user's lines."""

    type: str
    message: str
    phase: str
    where: SourceSite | None
    traceback: str


# ---- trace-attention ----


class CallSiteRecord(TypedDict):
    """hooks/call_stats.CallStats: a call site's counts and shapes, and the dense kernels charged to it."""

    calls: int
    in_compiled_region: bool
    backend: str | None
    compiled_into_graphs: int
    dense_forward: int
    dense_backward: int
    dense_forward_peak_bytes: int | None
    dense_backward_peak_bytes: int | None
    score_matrix_bytes: int
    training: bool | None
    q_shape: list[int | str]  # symbolic sizes as text when traced in a graph
    kv_shape: list[int | str]
    dtype: str
    mask: str
    mask_sparsity_pct: float | None


class RawRebound(TypedDict):
    """A raw flex_attention call through a name once bound to a compiled wrapper."""

    name: str
    file: str
    line: int
    compiled_at: str | None


class FlexSiteRecord(CallSiteRecord):
    """hooks/flex_calls.FlexSite: the calls of one line through one reference."""

    file: str
    line: int
    function: str
    module: str | None
    via: str
    wrapper_names: list[str]
    compiled_at: str | None
    rebound: RawRebound | None
    shared_graph_of: NotRequired[str | None]


class ModuleSiteRecord(CallSiteRecord):
    """hooks/hf_attention.SiteRecord: the calls of one attention module through one implementation."""

    module: str
    module_class: str
    impl: str
    file: str | None
    line: int | None
    function: str | None


# An attention layer of a traced model, as configured and as it ran (`class` is a keyword: the
# functional form).
LayerRecord = TypedDict(
    "LayerRecord",
    {"module": str, "class": str, "kind": str, "configured": str, "impl": str, "calls": int, "ran": bool},
)


class CompileCall(TypedDict):
    """A torch.compile call the traced code made."""

    file: str
    line: int
    target: str
    backend: str
    dynamic: bool | None
    fullgraph: NotRequired[bool]
    source: NotRequired[str]  # the line as written, to quote in a fix
    # made by a library (accelerate for HF's Trainer, nn.Module.compile): file/line are then the
    # user's frame that led there, and the setting that asked for it where the user wrote it
    library: NotRequired[str]
    library_at: NotRequired[str]
    setting: NotRequired[str | None]
    setting_at: NotRequired[str | None]


class FlaRefusal(TypedDict):
    """One of FLA's guards refused the run, at which stage, with the error where it raised."""

    guard: FlaGuardRecord
    stage: str
    error: NotRequired[ErrorRecord]


class TracedModel(TypedDict):
    model: str
    scale: str
    model_class: str
    model_type: str
    attn_implementation: str
    flex_refused: str | None
    no_backward: str | None
    backward: bool
    seq_len: int
    parameters: int
    layers: list[LayerRecord]
    sites: list[ModuleSiteRecord]
    hook_unavailable: str | None
    error: ErrorRecord | None
    fla: FlaState | None
    fla_refused: FlaRefusal | None


class TracedDrafter(TypedDict):
    fault: str | None
    scale: str
    backward: bool
    q_len: int
    context_len: int
    sites: list[ModuleSiteRecord]
    flex_sites: list[FlexSiteRecord]
    compile_calls: list[CompileCall]
    hook_unavailable: str | None
    error: ErrorRecord | None


class ImportStopped(TypedDict):
    """Where a traced script's own import of FLA met the keep-out, and the statement there."""

    module: str | None
    file: str | None
    line: int | None
    function: str | None
    statement: str | None


class TracedScript(TypedDict):
    script: str
    error: ErrorRecord | None
    fla: FlaState | None
    fla_import_stopped: ImportStopped | None
    fla_refused: FlaRefusal | None
    layers: list[LayerRecord]
    sites: list[ModuleSiteRecord]
    flex_sites: list[FlexSiteRecord]
    compile_calls: list[CompileCall]
    hook_unavailable: str | None


FIX_REPLAY_PHASE = "fix-replay"  # the phase of the dense kernels a fix replay runs itself: not the user's


class FixReplayRecord(TypedDict):
    """hooks/fix_replay.ReplayOutcome: one dense site's recorded forward call, replayed after the
    traced run through a fresh torch.compile(flex_attention) (Inductor), beside its dense kernel."""

    site: SourceSite | None  # the dense event's call site (its innermost user frame)
    forward_site: SourceSite | None  # the recorded call site it was charged to
    layer: str | None
    stack: list[str]
    device: str
    proven: bool  # the compiled call ran to the end with no dense kernel, its result the dense one's
    reason: str | None  # why not proven
    backward: bool  # forward and backward replayed (CUDA, where the site's backward ran)
    dense_kernels: int | None  # dense kernels during the compiled calls
    dense_peak_bytes: int | None  # CUDA: the dense call's peak over what was allocated before it
    fused_peak_bytes: int | None  # CUDA: the compiled call's (measured after a call that compiled it)
    dense_out_of_memory: bool  # the dense call ran out of memory on replay
    max_abs_diff: float | None  # over the output, and on CUDA the gradients of q, k and v
    seconds: float | None  # the replay's wall time, compile included
    replayed_as: str | None  # the site whose call (same shapes and mods) was replayed for this one


# ---- race ----


class ConcurrentEntryRecord(TypedDict):
    """hooks/autotuner_guard.ConcurrentEntry: a thread entering an autotuner another was inside."""

    kernel: str
    threads: list[str]
    stacks: list[list[str]]
    cold: list[bool | None]
    serialized: bool


class ThreadErrorRecord(TypedDict):
    """autotune/trials.ThreadError."""

    thread: str
    type: str
    message: str
    frame: str
    traceback: str
    kernel: str | None
    launch_site: str | None


class TrialRecord(TypedDict):
    """autotune/trials.Trial.to_dict: one run of the threads, forced to overlap or not."""

    forced: bool
    fix: str
    threads: int
    errors: list[ThreadErrorRecord]
    outputs_equal: bool | None
    concurrent_entries: list[ConcurrentEntryRecord]
    autotuners_entered: list[str]
    duration_s: float
    failed: bool


class KernelTrialRecord(TrialRecord):
    """autotune/kernel_runs: a trial of real kernels, in its trial host, tuned cold."""

    wall_s: float
    fresh_process: bool
    binaries_cached: bool
    tuning_entries_cleared: int
    tuning_results_on_disk: int
    entered_warm: list[str]
    benchmarked: dict[str, int]


class StateAccess(TypedDict):
    written_by: list[str]
    read_by: list[str]


class ClassAuditRecord(TypedDict):
    """autotune/audit.ClassAudit: an autotuner class's per-call state on `self`, read from its source."""

    cls: str
    audited: bool
    reason: str
    base_run: bool
    locked: bool
    per_call_state: dict[str, StateAccess]


# An autotuned kernel held as a module global of a loaded package (every thread shares it).
LiveAutotuner = TypedDict(
    "LiveAutotuner", {"kernel": str, "module": str, "class": str, "configs": int, "key": list[str]}
)


class RankRecord(TypedDict):
    rank: int
    pid: int
    autotuner_id: int
    output_equal: bool
    error: str | None


class ProcessesRecord(TypedDict):
    """The same workload with one process per worker over gloo: no shared autotuner, no race."""

    world: int
    backend: str
    ranks: list[RankRecord]
    distinct_processes: int
    failures: int


class ReferenceTarget(TypedDict):
    """The reference target the race ran (reference/target_pairs: what the fix switch does, its model)."""

    switch: str
    layer_types: list[str]
    linear_attention: str | None
    tokens: int
    parameters: int


# ---- env ----


class CacheRootRecord(TypedDict):
    """A Triton or Inductor cache root as the probed process resolves it, and where it lives."""

    kind: str
    path: str
    source: str
    exists: bool
    files: int
    bytes: int
    untrusted: str | None  # why another user's code could be in it
    mount_point: NotRequired[str]  # where the mount table names one
    filesystem: NotRequired[str]
    network_filesystem: NotRequired[bool]


class PackageBytecode(TypedDict):
    package: str
    path: str
    modules: int
    cached: int
    writable: bool


class BytecodeRecord(TypedDict):
    """How the user's processes write bytecode, and which large packages have theirs."""

    dont_write_bytecode: bool
    pycache_prefix: str | None
    cache_tag: str | None
    PYTHONDONTWRITEBYTECODE: str | None
    packages: list[PackageBytecode]


class RequirementRecord(TypedDict):
    """One requirement of an installed distribution on another (versions)."""

    requirement: str  # as its metadata writes it
    name: str
    installed: str | None  # the version installed; None: not installed, or not checked
    satisfied: bool | None  # None: not checked (no `packaging` in the probed interpreter)


class PackageRecord(TypedDict):
    name: str
    version: str
    requires: list[RequirementRecord]


class GpuRecord(TypedDict):
    index: int
    name: str
    capability: str
    memory_bytes: int


# ---- cache ----


class RootFacts(TypedDict):
    """Where a scanned cache root lives and how it was named (cache/scan.scan_root): what the cache
    judge turns into the filesystem, rights, space and naming findings."""

    untrusted: str | None  # why another user's code could be in it
    mount_point: NotRequired[str]  # where the mount table names one
    filesystem: NotRequired[str]
    network_filesystem: NotRequired[bool]
    free_bytes: int
    low_space: bool
    writable: bool  # this user may create entries in it
    shared_by_ranks: dict[str, str]  # the world-size variables, when every rank shares the root
    relative: bool  # configured as a relative path
    empty: bool  # the variable is set to ""
    source: str  # the variable (or default) that named it


# ---- run: what the agent writes in the command's processes, and what the doctor sees of them ----


class EventRecord(TypedDict):
    """What every line the agent writes starts with (agent/events.EventLog.write)."""

    t: float
    pid: int
    rank: int | None
    kind: str


class StartEvent(EventRecord):
    argv: list[str]  # redacted
    executable: str
    ppid: int
    cwd: str
    python: str
    env: dict[str, str]  # the rank variables only


class InstrumentedEvent(EventRecord):
    torch: str
    unavailable: list[str]  # the hooks that could not be installed, and why


class ExitEvent(EventRecord):
    ending: str  # exit, steps-limit, terminated, ...
    event_write_failures: int


class DeviceMemory(TypedDict):
    allocated_bytes: int
    peak_bytes: int  # the allocator's running peak
    reserved_bytes: int


class StepTimes(TypedDict):
    mean: float
    min: float
    max: float


class StepEvent(EventRecord):
    step: int  # the last optimizer step the record covers
    covers: int
    memory: dict[str, DeviceMemory]  # by device, cuda:N
    step_s: StepTimes | None


class DenseKernelEvent(EventRecord):
    event: DenseEventRecord


class LoggedDense(DenseEventRecord):
    """A dense kernel as the reader keeps it (DenseKernelEvent's event, with when)."""

    t: float


class ExceptionEvent(EventRecord):
    thread: str
    type: str
    message: str  # redacted
    traceback: str  # redacted
    where: SourceSite | None  # the innermost frame in the user's files
    raised_at: str | None
    module: str | None  # the innermost user nn.Module that was running
    oom: bool


class CallInFlight(TypedDict):
    """A flex_attention call the agent saw start (agent/torch_instruments._describe)."""

    t: float
    file: str | None
    line: int | None
    function: str | None
    module: str | None
    via: str | None
    thread: str
    calls_before: int
    dense_forward_before: int


class OomEvent(EventRecord):
    """What the allocator said at the failed allocation, before the exception unwound anything."""

    device: str
    requested_bytes: int
    device_total_bytes: int
    free_bytes: int
    thread: str
    in_flight: CallInFlight | None
    last_calls: list[CallInFlight]
    dense_events: list[DenseEventRecord]
    memory_snapshot: str | None
    steps: int


class AgentErrorEvent(EventRecord):
    what: str
    error: str


class SnapshotEvent(EventRecord):
    reason: str  # step, exit, exception, steps-limit, terminated, oom
    observations: dict[str, object]  # observations.RunSnapshot's JSON, loaded strictly by the reader


class ThreadStack(TypedDict):
    name: str
    frames: list[str]  # file:line in function, innermost last


class Stacks(TypedDict):
    """A stuck process's threads (runs/stacks.dump_stacks): py-spy's, else faulthandler's."""

    tool: str
    threads: list[ThreadStack]
    note: NotRequired[str]  # why not py-spy
    error: NotRequired[str]  # why there are none


class HangRecord(TypedDict):
    """The watchdog's stop: how long the run was silent, every live process's stacks by pid."""

    silent_s: float
    stacks: dict[int, Stacks]
    deadline_s: NotRequired[float]  # stopped at the run's time limit, not for silence


class LeftRunningRecord(TypedDict):
    """A process still running after the command (or a probe) ended, stopped by the doctor."""

    pid: int
    command: str
