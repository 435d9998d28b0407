"""Why one flex_attention call ran its dense kernel, and the fix for that reason: one cause model for
every judge (check-compile, trace-attention, run, expect_fused).

The fix is chosen from the cause, never from the symptom "it ran dense": a whole model compiled with
`backend="aot_eager"` is not fixed by a compiled flex wrapper (dynamo inlines the wrapper into the
model's graph, which the same backend compiles), and a recompile-limit fallback under
`dynamic=False` is not fixed by capturing numbers as tensors. Each cause names the line to change
where the evidence holds it: the `torch.compile` call with its backend or `dynamic=False`, the guard
that kept failing, the line that rebound a compiled wrapper to the raw function.

Evidence, in the order it decides:
1. dynamo disabled for the process;
2. how the call reached the kernel (its route, from torch's own frames: raw, a compiled wrapper that
   fell back, or a graph of a non-Inductor backend) and the backend of the region it was traced in;
3. dynamo's compile records: the recompile-limit record of the frame that fell back (its guard says
   what changed), or the exception that got a frame skipped;
4. the `torch.compile` calls the traced code made (their backend and `dynamic`), to name the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from dflashdoctor.judges.dynamo_causes import (
    DENSE_BACKENDS,
    Guard,
    frame_name,
    is_library_file,
    is_recompile_limit,
    is_skipped_frame,
    last_guard,
    parse_guard,
    raised_exception,
)
from dflashdoctor.records import CompileCall as CompileCallRecord
from dflashdoctor.records import CompileRecord, RawRebound
from dflashdoctor.report import Where

CauseKind = Literal[
    "dynamo-disabled",
    "disabled-region",
    "compiler-stance",
    "reentrant-checkpoint",
    "never-compiled",
    "rebound-wrapper",
    "model-backend",
    "wrapper-backend",
    "eager-backend",
    "recompile-limit-static-shapes",
    "recompile-limit-global",
    "recompile-limit-new-object",
    "recompile-limit",
    "changing-float",
    "compile-failed",
    "skipped-frame",
    "compiled-but-eager",
    # an exception a traced step raised, read as the cause it is (raised_cause.py, known_causes.py)
    "fullgraph-break",
    "flex-cpu-backward",
    "fx-tracing-flag",
    "shared-autotuner",
    "unknown",
]

# Frames that are flex_attention itself, or a wrapper made around it: a limit hit there is the one
# that made this call dense (other frames hitting theirs are the model's outer functions).
_FLEX_FRAMES = ("flex_attention", "_flex_attention_hop_wrapper")
_SIZE_GUARD = re.compile(r"size mismatch at index \d+|\.size\(\)\[\d+\] == \d+")
_NEW_OBJECT = ("___check_obj_id", "ID_MATCH", "___check_type_id")
_FLOAT_GUARD = re.compile(r"== -?(\d+\.\d*|\d*\.\d+)(e[-+]?\d+)?$|== -?(inf|nan)$")

FIX_WRAPPER = (
    "Call a wrapper made once at import, `_compiled = torch.compile(flex_attention)`, instead of "
    "flex_attention itself (or compile the module that calls it)."
)
FIX_BACKEND = "Compile flex_attention with the default backend: `torch.compile(flex_attention)`."
FIX_SKIPPED_FRAME = (
    "Fix the call so it does not raise (here: pass the arguments the first attempt lacked) "
    "instead of catching and retrying. If a process must recover, call "
    "`torch._dynamo.reset()` before the next compiled call."
)
FIX_DYNAMO_DISABLED = "Unset TORCHDYNAMO_DISABLE (and torch._dynamo.config.disable) for training runs."
_FAIL_FAST = (
    "Set `torch._dynamo.config.fail_on_recompile_limit_hit = True` so a run fails at once instead of "
    "silently running dense; raising recompile_limit only moves the cliff."
)


@dataclass(frozen=True)
class Cause:
    """One reason a call ran dense: a stable kind (tests and tables key on it), the sentence for a
    reader, the fix for that reason, and the line the fix changes, when the evidence names one."""

    kind: CauseKind
    summary: str
    fix: str
    where: Where | None = None


@dataclass(frozen=True)
class CompileCall:
    """A `torch.compile(...)` call the traced code made, as the flex-call recorder saw it."""

    file: str
    line: int
    target: str
    backend: str
    dynamic: bool | None
    fullgraph: bool = False
    source: str | None = None  # the line as written
    library: str | None = None  # the library that called torch.compile for the user (file/line: the user's frame)
    library_at: str | None = None
    setting: str | None = None  # the user's option that asked for it, as written
    setting_at: str | None = None  # `file:line`, `the command line`, `the environment`

    @property
    def at(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def where(self) -> Where:
        return Where(file=self.file, line=self.line)

    @staticmethod
    def read(records: list[CompileCallRecord]) -> list[CompileCall]:
        calls = []
        for r in records:
            if isinstance(r, dict) and isinstance(r.get("file"), str) and isinstance(r.get("line"), int):
                dynamic = r.get("dynamic")
                calls.append(
                    CompileCall(
                        file=r["file"],
                        line=r["line"],
                        target=str(r.get("target") or "?"),
                        backend=str(r.get("backend") or "inductor"),
                        dynamic=dynamic if isinstance(dynamic, bool) else None,
                        fullgraph=r.get("fullgraph") is True,
                        source=_text_or_none(r.get("source")),
                        library=_text_or_none(r.get("library")),
                        library_at=_text_or_none(r.get("library_at")),
                        setting=_text_or_none(r.get("setting")),
                        setting_at=_text_or_none(r.get("setting_at")),
                    )
                )
        return calls


@dataclass(frozen=True)
class DenseCall:
    """What the judge knows about one dense call site, whichever recorder saw it."""

    route: str | None  # flex_dense.ROUTES key: "raw", "compiled-eager", "graph"
    backend: str | None = None  # the backend of the region (or wrapper) it was traced in
    in_outer_region: bool = False  # traced inside a compiled region that is not a flex wrapper
    wrapper_backend: str | None = None  # the user's compiled flex wrapper's own backend
    wrapper_compiled_at: str | None = None
    rebound: RawRebound | None = None  # the compiled-looking name the call used was rebound raw
    known_file: str | None = None  # a file the guard's shortened path may stand for
    disabled_at: str | None = None  # `file:line in name`: the torch.compiler.disable'd function that called it
    stance: str | None = None  # torch.compiler.set_stance's stance at the call, when not the default
    recomputed: str | None = None  # the function reentrant checkpointing was recomputing
    site_at: str | None = None  # `file:line` of the call, as the recorders saw it
    stance_set_at: str | None = None  # `file:line` of the set_stance call


def explain(
    call: DenseCall,
    compiles: list[CompileRecord],
    compile_calls: list[CompileCall],
    *,
    dynamo_disabled: bool = False,
) -> Cause:
    """The cause of one dense call site, from the strongest evidence down."""
    if dynamo_disabled:
        return Cause(
            "dynamo-disabled",
            "dynamo disabled (TORCHDYNAMO_DISABLE=1 or torch._dynamo.config.disable): nothing is compiled",
            FIX_DYNAMO_DISABLED,
        )
    if call.disabled_at:
        return _disabled_region(call.disabled_at, compile_calls)
    if call.recomputed and call.route in ("raw", "compiled-eager", None):
        return _reentrant(call.recomputed)
    if call.stance in _EAGER_STANCES and call.route != "raw":
        return _stance(call.stance, call.stance_set_at, compiles)
    if call.rebound:
        return _rebound(call.rebound)
    if call.in_outer_region and call.backend in DENSE_BACKENDS:
        return _model_backend(call.backend, compile_calls)
    if call.wrapper_backend in DENSE_BACKENDS:
        return _wrapper_backend(call.wrapper_backend, call.wrapper_compiled_at)
    if call.route == "graph":
        return _graph_backend(call.backend, compile_calls)
    if call.route == "raw" and not call.in_outer_region:
        return Cause(
            "never-compiled", "never compiled: flex_attention called directly runs its dense kernel", FIX_WRAPPER
        )
    limit = _flex_limit_record(compiles)
    if limit is not None:
        return recompile_limit(compiles, limit, compile_calls, call.known_file)
    skipped = next((r for r in reversed(compiles) if is_skipped_frame(r)), None)
    if skipped is not None:
        return _skipped(skipped, compiles)
    failed = next((r for r in reversed(compiles) if r.get("fail_type") and not is_recompile_limit(r)), None)
    if failed is not None and call.route in ("compiled-eager", None):
        return failed_compile(failed, "dynamo ran the frame as plain Python instead (suppress_errors)", call.known_file)
    if call.route == "compiled-eager":
        return Cause(
            "compiled-but-eager",
            "a compiled wrapper ran flex_attention as plain Python (a fallback or graph break that dynamo left no "
            "record of in this process)",
            FIX_WRAPPER,
        )
    return Cause("unknown", "unknown: no eager backend, recompile limit or skipped frame was recorded", FIX_WRAPPER)


def _flex_limit_record(compiles: list[CompileRecord]) -> CompileRecord | None:
    """The latest recompile-limit record of a flex_attention frame, else the latest of any frame."""
    limits = [r for r in compiles if is_recompile_limit(r)]
    flex = [r for r in limits if frame_name(r, compiles) in _FLEX_FRAMES]
    return (flex or limits)[-1] if limits else None


def _graph_backend(backend: str | None, compile_calls: list[CompileCall]) -> Cause:
    """A graph of a non-Inductor backend called the kernel, seen from the kernel's side only: the
    user's compile calls tell a flex wrapper's backend from a whole region's; without them, the fix
    names both."""
    dense = [c for c in compile_calls if c.backend in DENSE_BACKENDS and (backend is None or c.backend == backend)]
    if dense and "flex" in dense[0].target:
        return _wrapper_backend(dense[0].backend, dense[0].at)
    if dense:
        return _model_backend(dense[0].backend, dense)
    return Cause(
        "eager-backend",
        "eager backend: the compiled graph that called it was compiled without Inductor (a backend such as eager "
        "or aot_eager), so flex runs dense",
        "Compile with the default backend (Inductor): remove `backend='eager'`/`'aot_eager'` from the "
        "torch.compile that made this graph, the flex_attention wrapper's or the model's around it.",
    )


def _model_backend(backend: str | None, compile_calls: list[CompileCall]) -> Cause:
    """A compiled region of a non-Inductor backend runs every flex call inside it dense, a compiled
    wrapper's too (dynamo inlines the wrapper into the region's graph)."""
    made = [c for c in compile_calls if c.backend == backend] if backend else []
    made = made or [c for c in compile_calls if c.backend in DENSE_BACKENDS]
    call = made[0] if made else None
    named = backend or (call.backend if call else "eager")
    inlined = (
        " A compiled flex_attention wrapper inside it does not help: dynamo inlines it into the region's graph, "
        "which the same backend compiles."
    )
    if call is not None and call.library:
        return _framework_backend(named, call, inlined)
    at = f" at {call.at}" if call else ""
    what = f"`torch.compile({call.target}, backend={call.backend!r})`{at}" if call else "its torch.compile call"
    if call is not None and call.source and "compile" in call.source:  # the line as the user wrote it
        what = f"`{call.source}`{at} (backend {call.backend!r})"
    summary = (
        f"compiled region of backend {named!r}: {what} never reaches Inductor, so every flex_attention call "
        "inside it runs the dense kernel"
    )
    plain = f"`torch.compile({call.target if call else 'model'})`"
    if call is not None and call.source and f"{call.target}.compile(" in call.source:
        plain = f"`{call.target}.compile()`"
    fix = f"Compile with Inductor: drop `backend={named!r}` from {what} ({plain})." + inlined
    return Cause("model-backend", summary, fix, call.where if call else None)


_NOT_A_LINE = ("the command line", "the environment")  # where a setting was given that is no file
_FRAMEWORK_NAMES = {
    "transformers": "HF Trainer (through accelerate)",
    "accelerate": "accelerate",
    "torch": "nn.Module.compile",
    "lightning": "Lightning",
}
_FRAMEWORK_FIX = {
    "transformers": 'set `torch_compile_backend="inductor"` in TrainingArguments (or leave it unset)',
    "accelerate": "set the dynamo backend to inductor: "
    '`Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor"))` or `dynamo_backend="inductor"` '
    "(`accelerate launch --dynamo_backend inductor`, ACCELERATE_DYNAMO_BACKEND)",
    "torch": "drop the backend from the module's `.compile(...)` call",
}


def _framework_backend(backend: str, call: CompileCall, inlined: str) -> Cause:
    """The compile was made by a library for the user (accelerate for HF's Trainer, nn.Module.compile):
    the fix names the user's setting and line, never the library's own line."""
    framework = _FRAMEWORK_NAMES.get(call.library or "", call.library or "a library")
    asked = f" (`{call.setting}` at {call.setting_at})" if call.setting else ""
    summary = (
        f"compiled region of backend {backend!r}: {framework} compiled the model with it for the user's "
        f"call at {call.at}{asked}, which never reaches Inductor, so every flex_attention call inside runs dense"
    )
    how = _FRAMEWORK_FIX.get(call.library or "", f"configure {framework} to compile with the inductor backend")
    where = _where_at(call.setting_at) if call.setting_at not in (None, *_NOT_A_LINE) else None
    fix = f"Compile with Inductor: {how}"
    fix += f"; the setting is `{call.setting}` at {call.setting_at}." if call.setting else f" (the call at {call.at})."
    return Cause("model-backend", summary, fix + inlined, where or call.where)


def _wrapper_backend(backend: str, compiled_at: str | None) -> Cause:
    where = _where_at(compiled_at)
    at = f" at {compiled_at}" if compiled_at else ""
    return Cause(
        "wrapper-backend",
        f"the flex_attention wrapper is compiled with backend={backend!r}{at}, which never reaches Inductor",
        f"Compile it with the default backend: `torch.compile(flex_attention)`{at} without `backend={backend!r}`.",
        where,
    )


# set_stance's stances that run compiled code eagerly: always, or on every recompile
_EAGER_STANCES = ("force_eager", "eager_on_recompile")


def _stance(stance: str, set_at: str | None, compiles: list[CompileRecord]) -> Cause:
    """dynamo's compiler stance made the compiled code run as plain Python."""
    at = f" at {set_at}" if set_at else ""
    if stance == "force_eager":
        what = "every compiled call runs as plain Python"
        fix = f'Remove `torch.compiler.set_stance("force_eager")`{at} (or set "default" again before training).'
    else:
        reasons = [reason for r in compiles if (reason := r.get("recompile_reason"))]
        guard = parse_guard(reasons[-1]).expression if reasons else None
        what = "each call that needs a recompile runs as plain Python instead" + (
            f" (the guard that failed: `{guard}`)" if guard else ""
        )
        fix = (
            f"Make the guarded value stable so no recompile is needed, or drop "
            f'`torch.compiler.set_stance("eager_on_recompile")`{at} for training: eager is the dense kernel.'
        )
    return Cause(
        "compiler-stance",
        f"torch.compiler.set_stance({stance!r}){at}: {what}, so flex_attention runs its dense kernel",
        fix,
        _where_at(set_at),
    )


def _reentrant(recomputed: str) -> Cause:
    """flex ran dense in reentrant activation checkpointing's recompute: `checkpoint(...,
    use_reentrant=True)` runs the checkpointed forward again inside backward, as plain Python on
    autograd's thread, where the compiled region around the first forward is gone."""
    what, _, at = recomputed.partition(" (checkpointed at ")
    place, _, name = what.partition(" in ")
    call_at = at.rstrip(")") or None
    return Cause(
        "reentrant-checkpoint",
        f"reentrant activation checkpointing recomputed `{name}` ({place}) in backward as plain Python, outside "
        "the compiled region, so the flex_attention it calls ran its dense kernel there",
        f"Pass `use_reentrant=False` to the `checkpoint(...)`{f' at {call_at}' if call_at else ''}: the "
        "non-reentrant checkpoint is traced by dynamo into the compiled graph, so the recompute is compiled too "
        "(HF models: `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})`).",
        _where_at(call_at) or _where_at(place),
    )


def _disabled_region(disabled_at: str, compile_calls: list[CompileCall]) -> Cause:
    """flex_attention called from a function under `torch.compiler.disable`: dynamo never traces
    into it, so a compiled model around it (or a compiled wrapper it would inline) changes nothing."""
    place, _, name = disabled_at.partition(" in ")
    where = _where_at(place)
    regions = [c for c in compile_calls if "flex_attention" not in c.target]  # a wrapper's compile is not the model's
    around = (
        f" (compiled code calls it: `{regions[0].source or regions[0].target}` at {regions[0].at})" if regions else ""
    )
    return Cause(
        "disabled-region",
        f"`{name}` at {place} is wrapped in `torch.compiler.disable`{around}: dynamo runs it as plain Python, "
        "so the flex_attention it calls runs the dense kernel",
        f"Remove `@torch.compiler.disable` from `{name}` at {place}, so the compiled region traces flex_attention "
        "into its graph; if it must stay disabled, call a compiled wrapper made once inside it "
        "(`_compiled = torch.compile(flex_attention)`).",
        where,
    )


def _rebound(rebound: RawRebound) -> Cause:
    name, at = rebound.get("name") or "the wrapper", rebound.get("file")
    where = Where(file=at, line=rebound.get("line")) if at else None
    place = f" at {at}:{rebound.get('line')}" if at else ""
    compiled = f" (compiled at {rebound['compiled_at']})" if rebound.get("compiled_at") else ""
    return Cause(
        "rebound-wrapper",
        f"`{name}`{compiled} was rebound to the raw flex_attention{place}: the call uses that name, so it never "
        "reaches the compiled wrapper",
        f"Remove the rebinding{place} (or bind `{name}` to the compiled wrapper again); keep one compiled "
        "wrapper and call it.",
        where,
    )


def _skipped(record: CompileRecord, compiles: list[CompileRecord]) -> Cause:
    raised_at = record.get("fail_user_frame_filename")
    where = Where(file=raised_at, line=record.get("fail_user_frame_lineno")) if raised_at else None
    return Cause(
        "skipped-frame",
        f"skipped frame: `{frame_name(record, compiles) or '?'}` raised {raised_exception(record)} while "
        "compiling; dynamo runs it eagerly from then on",
        FIX_SKIPPED_FRAME,
        where,
    )


def recompile_limit(
    compiles: list[CompileRecord],
    limit: CompileRecord | None,
    compile_calls: list[CompileCall],
    known_file: str | None,
) -> Cause:
    """A recompile-limit fallback, told apart by the guard that kept failing: a tensor size under
    static shapes, a module-level Python number, a new object each call, or another guard. `limit`
    None: the error said so with no compile record of its own (fail_on_recompile_limit_hit)."""
    guard = last_guard(compiles, limit, known_file)
    frame = (frame_name(limit, compiles) if limit is not None else None) or "?"
    failing = (
        f"the guard `{guard.expression}` kept failing"
        if guard.expression
        else "its guards kept failing (dynamo recorded no recompile reason)"
    )
    head = f"recompile limit: dynamo gave up on `{frame}` after {failing}"
    if _SIZE_GUARD.search(guard.expression):
        return _static_shapes(head, guard, compile_calls)
    if changing_float_guard(guard.expression):
        return changing_float(guard, f"{head}: every new value is a new graph, and past the limit flex runs dense")
    if guard.reads_global:
        name = guard.expression.split("global ", 1)[1].split()[0].removeprefix("__main__.")
        return Cause(
            "recompile-limit-global",
            f"{head}: score_mod/mask_mod read the module-level Python number `{name}`, so every new value is a "
            "new graph",
            f"Pass `{name}` as a tensor (`torch.tensor(value, device=...)`, updated in place) or close over a "
            f"tensor made once, instead of reading the Python number `{name}` in score_mod/mask_mod. {_FAIL_FAST}",
            guard.where,
        )
    if any(marker in guard.expression for marker in _NEW_OBJECT):
        return Cause(
            "recompile-limit-new-object",
            f"{head}: a new function or object each call (a score_mod/mask_mod or closure made per step) fails "
            "the identity guard",
            "Make score_mod/mask_mod once, outside the step, and feed what changes as tensors. " + _FAIL_FAST,
            guard.where,
        )
    return Cause(
        "recompile-limit",
        head,
        "Make the guarded value stable between calls (or a tensor), so the graph is reused. " + _FAIL_FAST,
        guard.where,
    )


_STAGES = {
    "InductorError": "Inductor's lowering or code generation",
    "BackendCompilerFailed": "the compile backend",
    "Unsupported": "dynamo's tracing",
    "TorchRuntimeError": "dynamo's tracing (running an op on fake tensors)",
    "UserError": "dynamo's tracing",
}


def failed_compile(
    record: CompileRecord, what_then: str, known_file: str | None = None, site_at: str | None = None
) -> Cause:
    """A compile that ended in an error: a changing Python float when its recompile guard pins one
    (automatic dynamic shapes made it symbolic, which Inductor's flex lowering rejects), else what
    the record shows: the frame, the stage and the error."""
    stage = _STAGES.get(str(record.get("fail_type")), "compiling")
    reason = (str(record.get("fail_reason") or "").strip().splitlines() or ["?"])[0][:200]
    if recompile_reason := record.get("recompile_reason"):
        guard = parse_guard(recompile_reason, known_file, record.get("co_filename"))
        if changing_float_guard(guard.expression):
            return changing_float(
                guard,
                f"after the first recompile, automatic dynamic shapes made it a symbolic float, and {stage} "
                f"failed on it ({record.get('fail_type')}: {reason[:120]}); {what_then}",
            )
    frame = record.get("co_name") or "?"
    at = f"{record.get('co_filename')}:{record.get('co_firstlineno')}" if record.get("co_filename") else "?"
    if is_library_file(at):  # torch's own frame (flex_attention compiled for the user's call): name the call
        at = site_at or "your call"
    return Cause(
        "compile-failed",
        f"compiling `{frame}` (for {at}) failed in {stage} ({record.get('fail_type')}: {reason}); {what_then}",
        f"Make the call at {at} compile: the error above says what {stage} cannot take; change that argument or "
        "setting. Compiling with `backend='aot_eager'` tells an Inductor failure (it then compiles) from a tracing "
        "one (it still fails). If `torch._dynamo.config.suppress_errors = True` is set, unset it so such a "
        "failure stops the run instead of running flex dense.",
        _where_at(at),
    )


def changing_float_guard(expression: str) -> bool:
    """A guard that pins a Python float a mod closes over or reads from an object
    (`score_mod.__closure__[0].cell_contents == 30.0`, `L['self'].cap == 0.5`): module globals are
    their own kind (recompile-limit-global)."""
    return "global " not in expression and bool(_FLOAT_GUARD.search(expression))


def changing_float(guard: Guard, what_then: str) -> Cause:
    """A Python float that changes every step (an annealed soft-cap or temperature) read by
    score_mod: under static shapes each value is a new graph until the limit makes flex dense;
    under automatic dynamic shapes the recompile turns it into a symbolic float that Inductor's
    flex_attention lowering cannot take, and the step raises."""
    name = guard.name
    where = guard.user_line
    at = f" ({where.file}:{where.line})" if where else ""
    return Cause(
        "changing-float",
        f"score_mod/mask_mod read the Python float `{name}`{at}, which changed between calls: {what_then}",
        f"Keep `{name}` in a 0-d tensor made once (`{name} = torch.tensor(value, device=...)`) and update it in "
        f"place each step (`{name}.fill_(new_value)`), so score_mod reads a tensor and one graph serves every "
        "value; a closure made per step over a Python float is a new constant each time.",
        where,
    )


def _static_shapes(head: str, guard: Guard, compile_calls: list[CompileCall]) -> Cause:
    static = [c for c in compile_calls if c.dynamic is False]
    if static:
        call = static[0]
        why = f"`torch.compile({call.target}, dynamic=False)` at {call.at} compiles one graph per shape"
        fix = (
            f"Drop `dynamic=False` from `torch.compile({call.target}, ...)` at {call.at}, or mark the varying "
            "length dynamic (`torch._dynamo.mark_dynamic(tensor, dim)`), or pad lengths to a few buckets. "
        )
        where: Where | None = call.where
    else:
        why = "shapes are compiled as static (dynamic=False, or automatic dynamic shapes turned off)"
        fix = (
            "Let the length be dynamic: drop `dynamic=False` (or mark it with "
            "`torch._dynamo.mark_dynamic(tensor, dim)`), or pad lengths to a few buckets. "
        )
        where = guard.where
    return Cause(
        "recompile-limit-static-shapes",
        f"{head}: {why}, and every new length is a new graph",
        fix + _FAIL_FAST,
        where,
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _where_at(at: str | None) -> Where | None:
    if not at or ":" not in at:
        return None
    file, _, line = at.rpartition(":")
    return Where(file=file, line=int(line)) if line.isdigit() else None
