"""Records every call of flex_attention's dense (unfused) kernels, where they execute.

Warnings fire once per process and dynamo's silent fallbacks emit none, so the only reliable signal
is the kernel itself: the higher-order ops `flex_attention` and `flex_attention_backward` keep their
dense Python kernels in `py_kernels[DispatchKey.CompositeExplicitAutograd]`. We swap those entries
for recording wrappers and clear each op's dispatch cache so the swap takes effect; Inductor-compiled
calls never reach them. Everything is guarded by the shape of the objects and restored on exit.

A dense backward runs on the autograd engine's thread, where no user frame is on the stack. The
call-site recorders therefore hang a gradient hook on each forward output (`watch_backward`): it
fires just before the backward of that call, and names the forward site the next dense backward
kernel belongs to. Calls no call-site recorder sees (a reference bound before recording began) are
linked through autograd itself: the dense forward runs inside flex_attention's autograd Function,
whose `ctx` comes back to its backward, so the forward's event rides on the ctx.

The frames between the kernel and the user also tell how flex_attention got there (`ROUTES`): as
plain Python outside torch.compile, as plain Python under a compiled wrapper (dynamo fell back), or
from a compiled graph whose backend is not Inductor. Those frames are torch's own, so the route is
None when a torch release names them otherwise.

A run that is diagnosed while it goes on pays this per dense call, so one walk from the kernel
outwards finds everything (call site, stack, route, ctx, graph node), and what a frame's code says
(a user file or not, a frame of flex_attention or of dynamo) is worked out once per code object.

Probed side: standard library and torch only.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from dflashdoctor.agent.post_import import when_imported
from dflashdoctor.hooks.dynamo_skip import skip_tree
from dflashdoctor.hooks.graph_nodes import GENERATED, GraphNode, node_of, resolve_module
from dflashdoctor.observations import DenseEvent
from dflashdoctor.records import SourceSite

if TYPE_CHECKING:
    from dflashdoctor.hooks.module_names import ModuleNamer

_HOP_MODULE = "torch._higher_order_ops.flex_attention"
_HOP_NAMES = {"flex_attention": "forward", "flex_attention_backward": "backward"}
_SCORE_BYTES_PER_ELEMENT = 4  # the dense kernels build scores in float32 whatever the input dtype
_STACK_DEPTH = 6
_FIRST_TORCH_WITH_FLEX = (2, 5)
_ROUTE_DEPTH = 80  # frames read from the kernel outwards for the route and the autograd ctx
_FLEX_FILE = os.path.join("torch", "nn", "attention", "flex_attention.py")
_EVAL_FRAME_FILE = os.path.join("torch", "_dynamo", "eval_frame.py")
_HOP_WRAPPER = "_flex_attention_hop_wrapper"  # what flex_attention compiles when called outside torch.compile
_FORWARDS_ON_CTX = "_dflashdoctor_dense_forwards"
# What a frame's code tells the walk (bits of `DenseFlexRecorder._facts`).
_USER = 1  # a call site: not torch, not dflashdoctor, not generated code
_HAS_CTX = 2  # has a local named ctx (f_locals is read only in such frames)
_HOP_WRAPPER_CODE = 4
_FLEX_CODE = 8  # torch's flex_attention function
_EVAL_FRAME_CODE = 16  # dynamo's compiled-function wrappers
_GENERATED_CODE = 32  # an FX graph's forward
_DISABLED_CODE = 64  # the wrapper `torch.compiler.disable` puts around a function
_RECOMPUTE_CODE = 128  # reentrant activation checkpointing's backward, which runs the forward again
_COMPILED_SCOPE = 256  # not torch's, ours nor generated: its locals may hold a compiled function's module
_ROUTE_FACTS = (
    _HAS_CTX | _HOP_WRAPPER_CODE | _FLEX_CODE | _EVAL_FRAME_CODE | _GENERATED_CODE | _DISABLED_CODE | _RECOMPUTE_CODE
)
_LAYERS_KEPT = 4096  # forward layers awaiting their backward, per graph module path
_T = TypeVar("_T")
_CODES_KEPT = 8192  # code objects (and graph lines) whose facts are kept; past it a table starts again
# dflashdoctor's own instrumentation, never a call site: another recorder's stand-in may sit between
# the user and the kernel (a test's expect_fused() inside a `dflashdoctor run`).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTRUMENTATION = tuple(os.path.join(_PACKAGE, part) + os.sep for part in ("hooks", "agent", "testing"))
ROUTES = {
    "raw": "flex_attention ran as plain Python, outside torch.compile",
    "compiled-eager": "a torch.compile wrapper ran flex_attention as plain Python: dynamo fell back to eager",
    "graph": "a compiled graph called the dense kernel: its torch.compile backend is not Inductor",
    "disabled": "a function wrapped in torch.compiler.disable called flex_attention: it always runs as plain Python",
}


def _disable_wrapper_codes() -> tuple[CodeType, ...]:
    """The code of the wrapper `torch.compiler.disable` (dynamo's DisableContext) returns: a frame
    running it is a disabled region. Read from the class itself, so a torch that moves it leaves
    the set empty and the route as before."""
    try:
        from torch._dynamo.eval_frame import DisableContext

        consts = DisableContext.__call__.__code__.co_consts
    except Exception:
        return ()
    return tuple(c for c in consts if isinstance(c, CodeType) and c.co_name == "_fn")


def _recompute_codes() -> tuple[CodeType, ...]:
    """The code of `torch.utils.checkpoint.CheckpointFunction.backward`: reentrant checkpointing
    runs the checkpointed forward again inside it, on autograd's thread, outside any compiled
    region. Empty where this torch has no such function."""
    try:
        from torch.utils.checkpoint import CheckpointFunction

        return (CheckpointFunction.backward.__code__,)
    except Exception:  # another torch: no recompute told apart, nothing else lost
        return ()


def _recomputed(frame: FrameType) -> str:
    """`file:line in name` of the function reentrant checkpointing recomputes (the ctx's
    run_function: a module's forward, or a function), and where it is checkpointed if its file says
    (a line passing `use_reentrant=True`, else the first `checkpoint(` call)."""
    fn = getattr(frame.f_locals.get("ctx"), "run_function", None)
    target = getattr(type(fn), "forward", None) if hasattr(fn, "forward") else fn
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if not isinstance(code, CodeType):
        return "?"
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_qualname}" + _checkpoint_call(code.co_filename)


@functools.lru_cache(maxsize=256)
def _checkpoint_call(file: str) -> str:
    """` (checkpointed at FILE:LINE)` for the line of `file` that passes use_reentrant=True, else
    its first `checkpoint(` call; empty when the file shows neither."""
    import linecache

    lines = linecache.getlines(file)[:20_000]
    for needle in ("use_reentrant=True", '"use_reentrant":True', "'use_reentrant':True", "checkpoint("):
        hit = next((i for i, text in enumerate(lines, 1) if needle in text.replace(" ", "")), None)
        if hit is not None:
            return f" (checkpointed at {file}:{hit})"
    return ""


def _stance_reader() -> Callable[[], str | None]:
    """Reads dynamo's compiler stance (`torch.compiler.set_stance`) at a dense call: "force_eager"
    runs every compiled call eagerly, "eager_on_recompile" every recompile. None where this torch
    keeps no stance, or it is the default."""
    try:
        from torch._dynamo import eval_frame
    except Exception:  # another torch: no stance read, nothing else lost
        return lambda: None

    def stance() -> str | None:
        name = getattr(getattr(eval_frame, "_stance", None), "stance", None)
        return name if isinstance(name, str) and name != "default" else None

    return stance


class _DynamoFacts:
    """What is read from dynamo itself, once per process as it finishes loading: dynamo is not
    imported for this where the program never compiles (a dense call before then runs in no disabled
    region, under no stance)."""

    disable_codes: tuple[CodeType, ...] = ()
    stance: Callable[[], str | None] = staticmethod(lambda: None)


_DYNAMO = _DynamoFacts()


def _dynamo_loaded(_module: Any) -> None:
    _DYNAMO.disable_codes = _disable_wrapper_codes()
    _DYNAMO.stance = _stance_reader()


when_imported("torch._dynamo", _dynamo_loaded)


def _disabled_function(frame: FrameType, not_users: tuple[str, ...]) -> str | None:
    """`file:line in name` of the user's function a disable wrapper's frame runs: its first line is
    the decorator's (`@torch.compiler.disable`), the line a user edits. torch's own disabled helpers
    (activation checkpointing's, under `not_users` or an installed package) are not a user's region."""
    fn = frame.f_locals.get("fn")
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if not isinstance(code, CodeType):
        return None
    path = os.path.abspath(code.co_filename)
    if path.startswith(not_users) or f"{os.sep}site-packages{os.sep}" in path:
        return None
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_qualname}"


class BackwardOwner(Protocol):
    """A forward call site that a later dense backward event can be charged to."""

    q_shape: list[int]

    def charge_backward(self, event: DenseEvent) -> SourceSite:
        """Count the event; return where the forward call was made."""
        ...


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _site(frame: FrameType, line: int) -> SourceSite:
    return {
        "file": frame.f_code.co_filename,
        "line": line,
        "function": frame.f_code.co_name,
        "module": frame.f_globals.get("__name__"),
    }


@functools.lru_cache(maxsize=64)
def _text(value: Any) -> str:
    """A dtype or device as an event spells it (`float32`, `cuda:0`); str() of either costs microseconds."""
    return str(value).replace("torch.", "")


def _autograd_ctx(candidate: Any) -> Any:
    from torch.autograd.function import FunctionCtx

    return candidate if isinstance(candidate, FunctionCtx) else None


class _Walk(NamedTuple):
    """What one walk from a dense kernel outwards found."""

    user_frames: list[FrameType]  # innermost first, at most _STACK_DEPTH
    route: str | None  # a key of ROUTES, or None
    ctx: Any  # the autograd ctx the kernel runs in
    generated: FrameType | None  # the innermost FX graph frame
    disabled_at: str | None  # the torch.compiler.disable'd function between the user and flex_attention
    recomputed: str | None  # the function reentrant checkpointing was running again when flex ran


def _score_bytes(q_shape: list[int], kv_shape: list[int]) -> int:
    if len(q_shape) != 4 or len(kv_shape) != 4:
        return 0
    batch, q_heads, q_len, _ = q_shape
    return batch * q_heads * q_len * kv_shape[2] * _SCORE_BYTES_PER_ELEMENT


class _ByInstruction(Generic[_T]):
    """A value worked out once per instruction of a code object, keyed by the instruction's offset,
    not its line: a frame's line is found by scanning its code's line table from the start (~10 us in
    the generated forward of a whole model, on every dense call). Holds each code object, so that its
    id stays its own; bounded, as generated graphs come and go."""

    def __init__(self) -> None:
        self._table: dict[tuple[int, int], tuple[CodeType, _T]] = {}

    def get(self, frame: FrameType, work_out: Callable[[FrameType], _T]) -> _T:
        key = (id(frame.f_code), frame.f_lasti)
        known = self._table.get(key)
        if known is None:
            if len(self._table) >= _CODES_KEPT:
                self._table.clear()
            known = self._table[key] = (frame.f_code, work_out(frame))
        return known[1]


def _place(frame: FrameType) -> tuple[str, int]:
    """`file:line in function` of a user frame, and the line."""
    code, line = frame.f_code, frame.f_lineno
    return f"{code.co_filename}:{line} in {code.co_name}", line


def _node_module(frame: FrameType) -> tuple[str, str] | None:
    node = node_of(frame)
    return (node.module_path, node.module_class) if node else None


class DenseFlexRecorder:
    """Context manager: while active, every dense flex_attention kernel call becomes a DenseEvent.

    `phase` is a label the caller moves along (for example "target:warm") so each event says which
    part of the probe triggered it. `unavailable` holds the reason when the hook could not be
    installed on this torch; the caller turns that into an info finding.
    """

    def __init__(
        self,
        skip_files: tuple[str, ...] = (),
        measure_memory: bool = False,
        on_event: Callable[[DenseEvent], None] | None = None,
        max_events: int | None = None,
        namer: ModuleNamer | None = None,
    ) -> None:
        """`skip_files`: harness files (a probe) that should never be named as the call site.

        `measure_memory` resets the CUDA allocator's peak around each dense kernel to measure what
        the kernel added: right for a probe's own process, wrong for a user's run that reads its own
        peaks, so it is off by default. `on_event` sees each event before its kernel runs (`run`
        logs it at once, and under --strict raises instead of running the kernel). `max_events`
        bounds the list for long runs: past it, the older half is dropped (counted in `dropped`).
        `namer` names the nn.Module that made each dense call (`DenseEvent.layer`).
        """
        self.on_event = on_event
        self.max_events = max_events
        self.dropped = 0
        self.events: list[DenseEvent] = []
        self.phase = ""
        self.unavailable: str | None = None
        self.measure_memory = measure_memory
        self.namer = namer
        # Per thread: the gradient hook and the backward kernel it announces run on the same autograd
        # thread (one per device), and data-parallel pairs backpropagate on several at once.
        self._backward_owner: dict[int, BackwardOwner] = {}
        # A graph's layer path (`L['self'].layers.1.self_attn`, class) -> the name its forward
        # resolved: a backward graph on the autograd thread has no frame to resolve it on.
        self._graph_layers: dict[tuple[str, str], str] = {}
        # The same path -> the layers its forwards named, latest last, for the backwards to take.
        self._forward_layers: dict[tuple[str, str], list[str]] = {}
        self._saved: list[tuple[Any, Any, Callable[..., Any]]] = []
        self.skip_prefixes = (
            *INSTRUMENTATION,
            _torch_dir(),
            os.path.abspath(threading.__file__),
            *(os.path.abspath(f) for f in skip_files),
        )
        # Thread ident -> (block, the outermost frame of the work that thread was doing when the block
        # opened): a dense call under that frame is older work than the block (watch_older_work).
        self._older_work: dict[int, tuple[tuple[int, FrameType], ...]] = {}
        self._older_work_lock = threading.Lock()  # blocks on two threads open and close at once
        # id(code) -> (code, its _USER.. bits). Holding the code keeps its id from being reused.
        self._facts: dict[int, tuple[CodeType, int]] = {}
        # a generated graph's instruction -> the node's module path and class, or None
        self._graph_lines: _ByInstruction[tuple[str, str] | None] = _ByInstruction()
        # a user frame's instruction -> (`file:line in function`, line)
        self._places: _ByInstruction[tuple[str, int]] = _ByInstruction()
        self._recompute_codes = _recompute_codes()
        # where the user last set the compiler stance (`file:line`), told by the flex-call recorder
        self.stance_set_at: str | None = None
        # Sees each dense forward's event and the op's arguments before its kernel runs (fix_replay.FixReplay).
        self.capture: Callable[[DenseEvent, tuple[Any, ...], dict[str, Any]], None] | None = None

    def __enter__(self) -> DenseFlexRecorder:
        self.unavailable = self._install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _install(self) -> str | None:
        import torch

        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
        if (major, minor) < _FIRST_TORCH_WITH_FLEX:
            return f"torch {torch.__version__} has no flex_attention (it came with 2.5)"
        try:
            from torch._C import DispatchKey

            importlib.import_module(_HOP_MODULE)
        except Exception as exc:  # an older or newer torch without the module
            return f"cannot import {_HOP_MODULE}: {exc}"
        module = sys.modules[_HOP_MODULE]
        key = DispatchKey.CompositeExplicitAutograd
        hops = []
        for name in _HOP_NAMES:
            hop = getattr(module, name, None)
            kernels = getattr(hop, "py_kernels", None)
            if hop is None or not isinstance(kernels, dict) or key not in kernels:
                return f"{_HOP_MODULE}.{name} has no dense kernel under {key} on this torch"
            if not hasattr(hop, "_dispatch_cache"):
                return f"{_HOP_MODULE}.{name} has no _dispatch_cache on this torch"
            hops.append((name, hop))
        for name, hop in hops:
            original = hop.py_kernels[key]
            hop.py_kernels[key] = self._wrap(_HOP_NAMES[name], original)
            hop._dispatch_cache.clear()
            self._saved.append((hop, key, original))
        return None

    def restore(self) -> None:
        while self._saved:
            hop, key, original = self._saved.pop()
            hop.py_kernels[key] = original
            hop._dispatch_cache.clear()

    def watch_older_work(self, block: int, running: dict[int, FrameType]) -> None:
        """`running`: for each thread busy when `block` opened, the outermost frame of its work then.
        A dense call made under that frame (or the backward of one) is that thread's older work: an
        earlier test's thread still going is not charged to the next test's block. The frames are
        held until `forget_older_work`, so their ids stay theirs."""
        with self._older_work_lock:
            older = dict(self._older_work)
            for ident, frame in running.items():
                older[ident] = (*older.get(ident, ()), (block, frame))
            self._older_work = older  # replaced whole: kernels on other threads read it unlocked

    def forget_older_work(self, block: int) -> None:
        with self._older_work_lock:
            older = {}
            for ident, watched in self._older_work.items():
                kept = tuple(entry for entry in watched if entry[0] != block)
                if kept:
                    older[ident] = kept
            self._older_work = older

    def _older_than(self, frame: FrameType | None) -> tuple[int, ...]:
        """The blocks whose watched frame for this thread is on the stack: one walk, only on a thread
        that was busy when some open block began."""
        watched = self._older_work.get(threading.get_ident())
        if not watched:
            return ()
        on_stack = set()
        while frame is not None:
            on_stack.add(id(frame))
            frame = frame.f_back
        return tuple(block for block, started in watched if id(started) in on_stack)

    def mark(self) -> int:
        """A position in the stream of events, for `events_since` (stable when old events are dropped)."""
        return self.dropped + len(self.events)

    def events_since(self, before: int) -> list[DenseEvent]:
        """This thread's events after `before` (a `mark()`): other threads (data-parallel pairs in a
        thread pool) append their own kernels to the same list meanwhile."""
        if self.dropped + len(self.events) == before:  # nothing dense anywhere since: every fused call
            return []
        me = threading.current_thread().name
        return [event for event in self.events[max(0, before - self.dropped) :] if event.thread == me]

    def watch_backward(self, output: Any, owner: BackwardOwner) -> None:
        """Charge the dense backward kernel of the call that produced `output` to `owner`.

        The hook returns None, so the gradient passes unchanged.
        """
        import torch

        if isinstance(output, tuple | list):
            output = next((t for t in output if isinstance(t, torch.Tensor)), None)
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda _grad: self._expect_backward_of(owner))

    def _expect_backward_of(self, owner: BackwardOwner) -> None:
        self._backward_owner[threading.get_ident()] = owner

    def _wrap(self, kind: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
        def recording_kernel(*args: Any, **kwargs: Any) -> Any:
            event = self._record(kind, args)
            if self.capture is not None and kind == "forward":
                self.capture(event, args, kwargs)
            if self.on_event is not None:
                self.on_event(event)
            if not (self.measure_memory and event.device.startswith("cuda")):
                result = kernel(*args, **kwargs)
            else:
                import torch

                base = torch.cuda.memory_allocated(event.device)
                torch.cuda.reset_peak_memory_stats(event.device)
                result = kernel(*args, **kwargs)
                event.peak_bytes = max(0, torch.cuda.max_memory_allocated(event.device) - base)
            if kind == "backward":  # charged once measured; a forward is charged by its call site
                self._charge_backward(event)
            return result

        recording_kernel.__wrapped__ = kernel  # type: ignore[attr-defined]
        skip_tree(recording_kernel)  # the dense kernel below: never frames of its own, as when torch calls it
        return recording_kernel

    def _learn(self, code: CodeType) -> int:
        """What `code` tells the walk, worked out on its first dense call: an `abspath` per frame and
        call cost more than the rest of the record."""
        filename = code.co_filename
        facts = _HAS_CTX if "ctx" in code.co_varnames else 0
        if not filename.startswith(GENERATED) and not os.path.abspath(filename).startswith(self.skip_prefixes):
            facts |= _COMPILED_SCOPE
            if not filename.startswith("<"):
                facts |= _USER
        if code.co_name == _HOP_WRAPPER:
            facts |= _HOP_WRAPPER_CODE
        elif code.co_name == "flex_attention" and filename.endswith(_FLEX_FILE):
            facts |= _FLEX_CODE
        if filename.endswith(_EVAL_FRAME_FILE):
            facts |= _EVAL_FRAME_CODE
        if filename.startswith(GENERATED):
            facts |= _GENERATED_CODE
        # by identity: `in` on a set hashes the code, and a dynamo resume function's constants hold a dict
        if any(code is known for known in _DYNAMO.disable_codes):
            facts |= _DISABLED_CODE
        if any(code is known for known in self._recompute_codes):
            facts |= _RECOMPUTE_CODE
        if len(self._facts) >= _CODES_KEPT:  # generated graphs come and go: bound what is held
            self._facts.clear()
        self._facts[id(code)] = (code, facts)
        return facts

    def _code_facts(self, code: CodeType) -> int:
        known = self._facts.get(id(code))
        return known[1] if known is not None else self._learn(code)

    def _compiled_scope(self, code: CodeType) -> bool:
        return bool(self._code_facts(code) & _COMPILED_SCOPE)

    def _walk(self, frame: FrameType | None) -> _Walk:
        """One pass outwards from the kernel's caller: _ROUTE_DEPTH frames for the route, the ctx
        and the graph frame, further only while fewer than _STACK_DEPTH user frames are found.

        The route: the outermost flex_attention frame decides; a dynamo frame above it means a
        compiled function ran it, eagerly when flex_attention's own eager wrapper is on the stack;
        a `torch.compiler.disable` wrapper above it, the innermost such, makes it "disabled" (the
        compiled code around it is then beside the point).
        """
        users: list[FrameType] = []
        ctx = generated = disabled_at = recomputed = None
        flex_seen = hop_wrapper = compiled_above = False
        depth = 0
        known_facts = self._facts.get
        while frame is not None and (depth < _ROUTE_DEPTH or len(users) < _STACK_DEPTH):
            code = frame.f_code
            known = known_facts(id(code))
            facts = known[1] if known is not None else self._learn(code)
            if facts & _USER and len(users) < _STACK_DEPTH:
                users.append(frame)
            if facts & _ROUTE_FACTS and depth < _ROUTE_DEPTH:  # most of torch's frames have none
                if ctx is None and facts & _HAS_CTX:  # read f_locals only where a ctx can be
                    ctx = _autograd_ctx(frame.f_locals.get("ctx"))
                if facts & _HOP_WRAPPER_CODE:
                    hop_wrapper = True
                elif facts & _FLEX_CODE:
                    flex_seen, compiled_above = True, False
                elif flex_seen and facts & _DISABLED_CODE:
                    disabled_at = disabled_at or _disabled_function(frame, self.skip_prefixes)
                elif facts & _RECOMPUTE_CODE:
                    recomputed = recomputed or _recomputed(frame)
                elif flex_seen and facts & _EVAL_FRAME_CODE:
                    compiled_above = True
                if generated is None and facts & _GENERATED_CODE:
                    generated = frame
            depth += 1
            frame = frame.f_back
        route = None
        if disabled_at is not None:
            route = "disabled"
        elif flex_seen:
            route = ("compiled-eager" if hop_wrapper else "graph") if compiled_above else "raw"
        return _Walk(users, route, ctx, generated, disabled_at, recomputed)

    def _record(self, kind: str, args: tuple[Any, ...]) -> DenseEvent:
        query, key = (*args, None, None)[:2]
        q_shape = list(getattr(query, "shape", ()))
        kv_shape = list(getattr(key, "shape", ()))
        frames, route, ctx, generated, disabled_at, recomputed = self._walk(sys._getframe(2))
        node = self._graph_node(generated) if generated is not None else None
        places = [self._places.get(frame, _place) for frame in frames]
        if route is None and node is not None:  # AOTAutograd's graph calls the op itself, below flex_attention
            route = "graph"
        event = DenseEvent(
            kind=kind,
            phase=self.phase,
            q_shape=q_shape,
            kv_shape=kv_shape,
            dtype=_text(getattr(query, "dtype", "")),
            device=_text(getattr(query, "device", "")),
            score_matrix_bytes=_score_bytes(q_shape, kv_shape),
            site=_site(frames[0], places[0][1]) if frames else None,
            stack=[where for where, _line in places],
            thread=threading.current_thread().name,
            route=route,
            disabled_at=disabled_at,
            recomputed=recomputed,
            stance=(stance := _DYNAMO.stance()),
            stance_set_at=self.stance_set_at if stance else None,
            layer=self._layer(node, frames, kind),
            older_than=self._older_than(sys._getframe(2)),
        )
        if ctx is not None:
            self._link_through_ctx(ctx, event)
        self.events.append(event)
        if self.max_events is not None and len(self.events) > self.max_events:
            half = len(self.events) // 2
            del self.events[:half]
            self.dropped += half
        return event

    def _graph_node(self, frame: FrameType) -> GraphNode | None:
        """The node a generated graph's frame is running, read once per instruction of the graph: a
        generated code object belongs to one GraphModule, whose nodes keep their module stacks."""
        module = self._graph_lines.get(frame, _node_module)
        return GraphNode(module_path=module[0], module_class=module[1], frame=frame) if module else None

    def _layer(self, node: GraphNode | None, frames: list[FrameType], kind: str) -> str | None:
        """The module that made the call: the layer a running graph node was traced in, else the
        innermost module whose forward is on the stack."""
        if self.namer is None:
            return None
        named = self._graph_layer(node, kind) if node is not None else None
        if named is None and frames:
            named = self.namer.calling_module(frames[0])
        return named

    def _graph_layer(self, node: GraphNode, kind: str) -> str | None:
        """A forward resolves the node's module on its live frames. A backward graph runs on
        autograd's thread with no such frame; blocks compiled one by one share one graph, and so
        one module path (`L['self'].attention`), so the layers their forwards named are kept as a
        stack per path and each backward takes the latest (autograd runs backwards last first)."""
        key = (node.module_path, node.module_class)
        module = resolve_module(node.module_path, node.frame.f_back, _ROUTE_DEPTH, self._compiled_scope)
        if module is not None and self.namer is not None:
            name = self._graph_layers[key] = self.namer.name(module, node.frame.f_back)
            if kind == "forward":
                stack = self._forward_layers.setdefault(key, [])
                stack.append(name)
                del stack[:-_LAYERS_KEPT]
            return name
        pending = self._forward_layers.get(key) if kind == "backward" else None
        return pending.pop() if pending else self._graph_layers.get(key)

    @staticmethod
    def _link_through_ctx(ctx: Any, event: DenseEvent) -> None:
        """A forward leaves its event on the autograd ctx; the backward of that ctx takes the one of
        its shape (a graph holding several calls backpropagates them last first) and with it the
        forward's site, route and layer."""
        forwards = getattr(ctx, _FORWARDS_ON_CTX, None)
        if event.kind == "forward":
            if forwards is None:
                try:
                    setattr(ctx, _FORWARDS_ON_CTX, forwards := [])
                except (AttributeError, TypeError):  # a ctx that takes no attributes: no link
                    return
            forwards.append(event)
            return
        if forwards is None:
            return
        for i in range(len(forwards) - 1, -1, -1):
            forward = forwards[i]
            if forward.q_shape == event.q_shape:
                del forwards[i]
                event.site = forward.site or event.site
                # the forward named its layer from a live frame; a backward graph's layer comes from a
                # table keyed by the graph's module path, which blocks sharing one graph also share
                event.route, event.layer = forward.route, forward.layer or event.layer
                event.disabled_at = forward.disabled_at
                event.recomputed = forward.recomputed or event.recomputed
                event.stance, event.stance_set_at = forward.stance, forward.stance_set_at
                event.older_than = event.older_than or forward.older_than
                return

    def _charge_backward(self, event: DenseEvent) -> None:
        owner = self._backward_owner.pop(threading.get_ident(), None)
        # The shape check keeps a fused call's spent hook from claiming an unrecorded call's backward.
        if owner is not None and owner.q_shape == event.q_shape:
            event.forward_site = owner.charge_backward(event)


# bookkeeping the stand-ins call from frames dynamo may run eagerly (dynamo_skip.py says why)
for _bookkeeping in (
    DenseFlexRecorder._record,
    DenseFlexRecorder.mark,
    DenseFlexRecorder.events_since,
    DenseFlexRecorder.watch_backward,
    DenseFlexRecorder._expect_backward_of,
):
    skip_tree(_bookkeeping)
