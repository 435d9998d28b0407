"""Records flex_attention calls made through the user's own references, fused or not.

A fused call leaves no trace at run time: Inductor's kernel replaces the whole op. So the call is
seen at its boundary instead. While active, this recorder
- puts a recording stand-in at `torch.nn.attention.flex_attention.flex_attention`, so code that
  imports flex_attention afterwards and calls it directly is recorded as a raw call, and
- wraps `torch.compile`: compiling flex_attention (or the stand-in) returns the real compiled
  wrapper inside a recording one, remembered with the line that compiled it.
Recording happens outside any compiled region: inside one (`torch.compiler.is_compiling()`) the
stand-in forwards to the real function at once, so dynamo traces no bookkeeping and adds no graph
break; such a call is listed once per graph it is compiled into, at trace time (compiled_calls.py).
Code that bound flex_attention before the recorder started (transformers binds it at import) keeps
the real function; the attention-interface recorder covers that path. transformers' own compiled
singleton, made while recording, is recorded too (via TRANSFORMERS_COMPILED) for the calls the
interface does not see: a model of the user's that calls `compile_friendly_flex_attention` itself,
as SpecForge's DFlash drafter does; such a site is the user's line that called into transformers.
Both attributes are restored on exit.

Probed side: standard library and torch.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import linecache
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from threading import current_thread, get_ident
from time import time
from types import CodeType, FrameType
from typing import Any

import torch

from dflashdoctor.agent.post_import import when_imported
from dflashdoctor.hooks import compiled_calls, executed_files
from dflashdoctor.hooks.call_stats import CallStats
from dflashdoctor.hooks.compile_origin import library_of, origin
from dflashdoctor.hooks.compiled_calls import traced_call, traced_tensor
from dflashdoctor.hooks.dynamo_skip import skip_frame, skip_tree
from dflashdoctor.hooks.flex_dense import INSTRUMENTATION, DenseFlexRecorder
from dflashdoctor.hooks.module_names import ModuleNamer
from dflashdoctor.hooks.rebinding import rebinding, user_files_on_stack
from dflashdoctor.records import RawRebound

_FLEX_MODULE = "torch.nn.attention.flex_attention"
_COMPILE_ARGUMENT = re.compile(r"\bcompile\(\s*([\w.\[\]]+)\s*[,)]")
_MODULE_COMPILE = re.compile(r"([\w.\[\]]+)\.compile\(")  # `block.compile(backend=...)`: nn.Module.compile
_COMPILE_CALLS_KEPT = 64
_FAST_SITES_KEPT = 4096  # calling modules remembered by identity
_SOURCE_KEPT = 200  # characters of the compile call's line kept, to quote it in a fix
# a site's key: (file, line, id of the reference called, module), and "traced" after those of a call
# dynamo traced into a graph
_SiteKey = tuple[str, int, int, str | None] | tuple[str, int, int, str | None, str]
COMPILED_WRAPPER = "compiled wrapper"
RAW = "raw flex_attention"
TRANSFORMERS_COMPILED = "transformers compiled flex"  # its singleton, called outside the interface


def _in_transformers(file: str) -> bool:
    parts = os.path.normpath(file).split(os.sep)
    return "transformers" in parts and "site-packages" in parts


def _compiled_name(file: str, line: int, target: Any, raw: Any) -> str:
    """How the call site spelled what it compiled (`model`, `self.layer`), else what it is."""
    text = linecache.getline(file, line)
    match = _COMPILE_ARGUMENT.search(text) or _MODULE_COMPILE.search(text)
    if match and match.group(1) != "torch":  # `torch.compile(Block(), ...)` names no variable
        return match.group(1).strip()
    if target is raw:
        return "flex_attention"
    return getattr(target, "__qualname__", None) or type(target).__name__


_REPEATED_INDEX = re.compile(r"\.\d+\.")


def _layer_shape(name: str) -> str:
    """`layers.N.attention` for `layers.3.attention`: the layers one block class repeats."""
    return _REPEATED_INDEX.sub(".N.", f".{name}.")


def _compiled_block(name: str, by_name: dict[str, list[Any]]) -> bool:
    """The module `name` or one above it is compiled by itself: `nn.Module.compile()` set its
    compiled call, or torch.compile wrapped it (an OptimizedModule holds it as `_orig_mod`)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        for module in by_name.get(".".join(parts[:end]), []):
            if getattr(module, "_compiled_call_impl", None) is not None or hasattr(module, "_orig_mod"):
                return True
    return False


def _prime_dynamo_tables(real_compile: Callable[..., Any]) -> None:
    """Make dynamo read the real `torch.compile`, not the recorder's stand-in.

    Dynamo treats `torch.compile` called inside traced code as a no-op, finding it in two tables it
    builds once per process (functools.cache) from whatever `torch.compile` is at that moment. Built
    while the replacement is in place, they would name the replacement forever, and the real
    `torch.compile` inside a compiled region would become a graph break after the recorder has gone.
    So they are built with the real one in place: now where dynamo is loaded, else as it finishes
    loading (a process that never compiles never imports it, and must not pay a second for it here).
    """
    if "torch._dynamo" not in sys.modules:
        when_imported("torch._dynamo", lambda _module: _prime_dynamo_tables(real_compile))
        return
    import importlib

    current, torch.compile = torch.compile, real_compile
    try:
        for module_name, owner, attr in (
            ("torch._dynamo.trace_rules", None, "get_torch_obj_rule_map"),
            ("torch._dynamo.variables.torch", "TorchInGraphFunctionVariable", "_get_handlers"),
        ):
            try:
                namespace = importlib.import_module(module_name)
                getattr(getattr(namespace, owner) if owner else namespace, attr)()
            except Exception:  # another torch: its tables are not ours to prime; tracing goes on
                continue
    finally:
        torch.compile = current


@dataclass(kw_only=True)
class FlexSite(CallStats):
    """All calls from one line and module through one reference (a compiled wrapper or the raw function)."""

    file: str
    line: int
    function: str
    module: str | None
    via: str  # COMPILED_WRAPPER, RAW or TRANSFORMERS_COMPILED
    wrapper_id: int | None = None  # id of the recording wrapper, to find the names it is bound to
    wrapper_names: list[str] = field(default_factory=list)  # "module:attr" bindings, filled at the end
    # the user's files on the stack of the first call (the launcher script, a file run through runpy):
    # where a rebinding of the called name is looked for first; not written out
    stack_files: tuple[str, ...] = ()
    compiled_at: str | None = None  # file:line of the torch.compile call
    rebound: RawRebound | None = None  # a raw call through a name once bound to a compiled wrapper
    # the layer whose trace this site's graph is (blocks compiled one by one share one graph,
    # which dynamo traces in the first block only)
    shared_graph_of: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("wrapper_id")
        data.pop("stack_files")
        return data


# An eager call as kept while it runs and after: (start time, site, the thread, the site's calls and
# dense forwards before it). A tuple: it is made inside the user's training step. The thread itself,
# not its ident, which Linux gives the next thread at once (DataParallel starts new ones each step);
# its name is read when the call is told.
FlexCall = tuple[float, "FlexSite", threading.Thread, int, int]


class FlexCallRecorder:
    def __init__(
        self, dense: DenseFlexRecorder, namer: ModuleNamer, keep_calls: int | None = None, watch_exec: bool = False
    ) -> None:
        """`keep_calls`: keep the eager call each thread is inside (`in_flight`) and the last so many
        (`last_calls`): `run` names them when the process runs out of memory. Kept here, inline, not
        by a callback: two more Python calls per call cost more than the rest of the bookkeeping.
        `watch_exec` keeps the files executed through `exec` meanwhile (runpy), where a rebinding is
        looked for too: an audit hook, so only a probe's own process asks for it, never a user's run."""
        self.dense = dense
        self.namer = namer
        self.in_flight: dict[int, FlexCall] | None = {} if keep_calls is not None else None
        self.last_calls: collections.deque[FlexCall] = collections.deque(maxlen=keep_calls or 0)
        self.sites: dict[_SiteKey, FlexSite] = {}
        # (caller code, line, wrapper id, id of the calling module) -> (that module, weakly; its site)
        self._site_by_owner: dict[tuple[CodeType, int, int, int], tuple[Any, FlexSite]] = {}
        self._wrappers: dict[int, Callable[..., Any]] = {}
        self.compile_calls: list[dict[str, Any]] = []  # the user's torch.compile calls, for causes
        self._not_user_compiles: set[CodeType] = set()  # code whose torch.compile calls are not the user's
        self._transformers_code: dict[CodeType, bool] = {}
        # Set where the attention-interface recorder runs too: true while a call is inside the
        # interface, which records it itself (transformers' compiled singleton is called from there).
        self.seen_by_interface: Callable[[], bool] = lambda: False
        self._executed = executed_files.Recording() if watch_exec else None

    def __enter__(self) -> FlexCallRecorder:
        self._module = sys.modules.get(_FLEX_MODULE) or __import__(_FLEX_MODULE, fromlist=["flex_attention"])
        self._raw, self._real_compile = self._module.flex_attention, torch.compile
        _prime_dynamo_tables(self._real_compile)
        self._real_set_stance = getattr(torch.compiler, "set_stance", None)
        self._stand_in = self._recording(self._raw, via=RAW)
        # a module's attribute the ModuleType it is typed as does not declare: set by name
        setattr(self._module, "flex_attention", self._stand_in)  # noqa: B010
        torch.compile = self._compile
        if self._real_set_stance is not None:
            torch.compiler.set_stance = self._set_stance
        if self._executed is not None:
            self._executed.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self._module, "flex_attention", self._raw)  # noqa: B010
        torch.compile = self._real_compile
        if self._real_set_stance is not None:
            torch.compiler.set_stance = self._real_set_stance
        if self._executed is not None:
            self._executed.__exit__()

    def _compile(self, model: Any = None, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # torch compiles helpers inside traced code: pass them through
            return self._real_compile(model, **kwargs)
        if model is None:  # decorator form: torch.compile(backend=...)(fn)
            return lambda fn: self._compile(fn, **kwargs)
        target = self._raw if model is self._stand_in else model
        compiled = self._real_compile(target, **kwargs)
        caller = sys._getframe(1)
        self._note_compile(caller, target, kwargs)
        if target is not self._raw:
            return compiled
        backend = kwargs.get("backend", "inductor")
        return self._recording(
            compiled,
            via=TRANSFORMERS_COMPILED if _in_transformers(caller.f_code.co_filename) else COMPILED_WRAPPER,
            compiled_at=f"{caller.f_code.co_filename}:{caller.f_lineno}",
            backend=backend if isinstance(backend, str) else type(backend).__name__,
        )

    def _set_stance(self, *args: Any, **kwargs: Any) -> Any:
        """`torch.compiler.set_stance`, with the user's line that set it kept for the dense recorder
        (a stance of "force_eager" makes every compiled flex call dense)."""
        assert self._real_set_stance is not None
        if not torch.compiler.is_compiling():
            caller = sys._getframe(1)
            made_by = origin(caller, INSTRUMENTATION) if library_of(caller.f_code.co_filename) else None
            at = f"{made_by.file}:{made_by.line}" if made_by else f"{caller.f_code.co_filename}:{caller.f_lineno}"
            self.dense.stance_set_at = at
        return self._real_set_stance(*args, **kwargs)

    def _outside_transformers(self, frame: FrameType) -> FrameType:
        """The first frame at or above `frame` that is not transformers' own: the user's line that
        called `compile_friendly_flex_attention`. Decided once per code object."""
        while frame.f_back is not None:
            inside = self._transformers_code.get(frame.f_code)
            if inside is None:
                inside = self._transformers_code[frame.f_code] = _in_transformers(frame.f_code.co_filename)
            if not inside:
                break
            frame = frame.f_back
        return frame

    def _note_compile(self, caller: FrameType, target: Any, kwargs: dict[str, Any]) -> None:
        """Keep the user's own `torch.compile` calls (not transformers' or torch's): a cause names the
        line whose backend or `dynamic=False` made flex run dense."""
        code = caller.f_code
        if code in self._not_user_compiles or len(self.compile_calls) >= _COMPILE_CALLS_KEPT:
            return  # raw flex_attention compiles its eager wrapper on every call: decided once per code
        file, line = code.co_filename, caller.f_lineno
        made_by = None
        if library_of(file) is not None:
            # a library compiling the user's model (accelerate for HF's Trainer, nn.Module.compile) is
            # the user's compile, told by the user's line and setting; its own helpers (flex_attention's
            # eager wrapper, transformers' compiled flex singleton) are not
            made_by = (
                origin(caller, INSTRUMENTATION)
                if isinstance(target, torch.nn.Module) or (code.co_name == "compile" and library_of(file) == "torch")
                else None
            )
            if made_by is None:
                self._not_user_compiles.add(code)
                return
            file, line = made_by.file, made_by.line
        elif os.path.abspath(file).startswith(self.dense.skip_prefixes):
            self._not_user_compiles.add(code)
            return
        backend = kwargs.get("backend", "inductor")
        dynamic = kwargs.get("dynamic")
        self.compile_calls.append(
            {
                "file": file,
                "line": line,
                **(
                    {
                        "library": made_by.library,
                        "library_at": made_by.library_at,
                        "setting": made_by.setting,
                        "setting_at": made_by.setting_at,
                    }
                    if made_by and made_by.library != "torch"  # `block.compile(...)`: the user's own line
                    else {}
                ),
                "target": _compiled_name(file, line, target, self._raw),
                "source": linecache.getline(file, line).strip()[:_SOURCE_KEPT],
                "backend": backend if isinstance(backend, str) else type(backend).__name__,
                "dynamic": dynamic if isinstance(dynamic, bool) else None,
                "fullgraph": kwargs.get("fullgraph") is True,
            }
        )

    def _recording(self, fn: Callable[..., Any], via: str, **about: Any) -> Callable[..., Any]:
        def note_traced_call(ctx: Any) -> None:  # dynamo calls it at trace time, through comptime
            call = traced_call(ctx, self.dense.skip_prefixes)
            if call is None:
                return
            module = self.namer.name(call.module, sys._getframe()) if call.module is not None else None
            site_key = (call.file, call.line, id(recording_flex), module, "traced")
            site = self.sites.get(site_key)
            if site is None:
                site = self.sites[site_key] = FlexSite(
                    file=call.file,
                    line=call.line,
                    function=call.function,
                    module=module,
                    via=via,
                    wrapper_id=id(recording_flex),
                    **about,
                )
            site.observe_traced(call.backend, traced_tensor(ctx, "query"), traced_tensor(ctx, "key"))

        @functools.wraps(fn, updated=())  # not __dict__: a compiled fn's dynamo marks would skip us
        def recording_flex(query, key, value, *args, **kwargs):
            if torch.compiler.is_compiling():
                if compiled_calls.comptime is not None:
                    compiled_calls.comptime(note_traced_call)
                return fn(query, key, value, *args, **kwargs)
            caller = sys._getframe(1)
            if via == TRANSFORMERS_COMPILED:
                if self.seen_by_interface():
                    return fn(query, key, value, *args, **kwargs)
                caller = self._outside_transformers(caller)
            site = self._site_of(caller, recording_flex, via, about)
            in_flight = self.in_flight
            if in_flight is not None:  # inline: every call on the fused path pays for what runs here
                in_flight[get_ident()] = (time(), site, current_thread(), site.calls, site.dense_forward)
            before = self.dense.mark()
            try:
                out = fn(query, key, value, *args, **kwargs)
            except BaseException:  # an OOM, --strict: counted, its dense kernel is this site's
                with contextlib.suppress(Exception):  # but the program sees its own exception
                    self._call_ended(site, query, key, args, kwargs, before)
                raise
            if self._call_ended(site, query, key, args, kwargs, before):
                # flex's backward is dense exactly where its forward was: only then is it watched
                self.dense.watch_backward(out, site)
            return out

        skip_frame(recording_flex)  # one code object for every stand-in: marked once, cheaply again
        self._wrappers[id(recording_flex)] = recording_flex
        return recording_flex

    def _site_of(self, caller: FrameType, wrapper: Any, via: str, about: dict[str, Any]) -> FlexSite:
        """The site of an eager call from `caller` through `wrapper`: one line serves many layers,
        so a site is keyed by the calling module too. Every call after a site's first finds it by the
        calling module object, without naming it again (a weak reference tells a module freed and its
        id reused)."""
        owner = self.namer.calling_self(caller)
        fast_key = (caller.f_code, caller.f_lineno, id(wrapper), id(owner))
        known = self._site_by_owner.get(fast_key)
        if known is not None and (known[0] is None or known[0]() is owner):
            return known[1]
        site = self._new_site(caller, owner, wrapper, via, about)
        if len(self._site_by_owner) >= _FAST_SITES_KEPT:  # modules made anew every step: stay bounded
            self._site_by_owner.clear()
        self._site_by_owner[fast_key] = (weakref.ref(owner) if owner is not None else None, site)
        return site

    def _new_site(self, caller: FrameType, owner: Any, wrapper: Any, via: str, about: dict[str, Any]) -> FlexSite:
        module = self.namer.name(owner, caller) if owner is not None else None
        site_key = (caller.f_code.co_filename, caller.f_lineno, id(wrapper), module)
        site = self.sites.get(site_key)
        if site is None:
            site = self.sites[site_key] = FlexSite(
                file=caller.f_code.co_filename,
                line=caller.f_lineno,
                function=caller.f_code.co_name,
                module=module,
                via=via,
                wrapper_id=id(wrapper),
                stack_files=user_files_on_stack(caller) if via == RAW else (),
                **about,
            )
        return site

    def _add_shared_graph_sites(self) -> None:
        """Blocks compiled one by one (`block.compile()`, `layers[i] = torch.compile(block)`) run one
        graph that dynamo traced in the first block only, so a flex call traced there stands for the
        same call in every block of that class compiled the same way. Each such block gets its own
        site, marked with the layer it shares the graph of; a dense kernel still names its own layer."""
        by_name: dict[str, list[Any]] = {}
        for name, module in self.namer.named_modules():
            by_name.setdefault(name, []).append(module)
        traced = [(key, site) for key, site in self.sites.items() if key[-1] == "traced" and site.module]
        known = {site.module for site in self.sites.values()}
        for key, site in traced:
            assert site.module is not None
            shape, kinds = _layer_shape(site.module), {type(m) for m in by_name.get(site.module, [])}
            if not kinds or not _compiled_block(site.module, by_name):
                continue
            for name, modules in by_name.items():
                if name in known or _layer_shape(name) != shape or not kinds & {type(m) for m in modules}:
                    continue
                if _compiled_block(name, by_name):
                    self.sites[(*key[:3], name, "traced")] = replace(site, module=name, shared_graph_of=site.module)
                    known.add(name)

    def _call_ended(
        self, site: FlexSite, query: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any], before: int
    ) -> bool:
        """Whether the call ran dense. A method, not a closure per call: this runs inside the user's
        training step."""
        if self.in_flight is not None:
            call = self.in_flight.pop(get_ident(), None)
            if call is not None:
                self.last_calls.append(call)
        dense = self.dense.events_since(before)
        mask = kwargs.get("block_mask", args[1] if len(args) > 1 else None)  # args[0] is score_mod
        site.observe(query, key, mask, training=bool(query.requires_grad), dense=dense)
        return bool(dense)

    def name_wrappers(self, namespaces: dict[str, dict[str, Any]]) -> None:
        """Find the names each recording wrapper is bound to: `label:attr` for a module-level name,
        `layers.0.self_attn.attr` for an attribute of a named nn.Module.

        `namespaces` maps a label to a module's globals: loaded modules are searched as well, but
        a script run as __main__ is gone from sys.modules once it returns, so the caller passes
        its globals in.
        """
        spaces = dict(namespaces)
        for module_name, module in list(sys.modules.items()):
            if hasattr(module, "__dict__"):
                spaces.setdefault(module_name, vars(module))
        bindings: dict[int, list[str]] = {}
        for label, space in spaces.items():
            for attr, value in list(space.items()):
                if self._wrappers.get(id(value)) is value:
                    bindings.setdefault(id(value), []).append(f"{label}:{attr}")
        for name, layer in self.namer.named_modules():  # a wrapper kept on a layer: `layers.0.attn.fn`
            for attr, value in list(vars(layer).items()):
                if self._wrappers.get(id(value)) is value:
                    bindings.setdefault(id(value), []).append(f"{name}.{attr}")
        self._add_shared_graph_sites()
        for site in self.sites.values():
            site.wrapper_names = bindings.get(site.wrapper_id or -1, [])
            if site.via == RAW:
                executed = tuple(self._executed.files) if self._executed is not None else ()
                strings = tuple(self._executed.strings) if self._executed is not None else ()
                site.rebound = rebinding(site.file, site.line, site.stack_files + executed, strings)


# bookkeeping never compiled as frames of their own (dynamo_skip.py says why)
for _bookkeeping in (
    FlexCallRecorder._site_of,
    FlexCallRecorder._new_site,
    FlexCallRecorder._call_ended,
    FlexCallRecorder._compile,  # torch.compile's stand-in: compiling is lazy, no user code runs in it
    FlexCallRecorder._set_stance,
    FlexCallRecorder._outside_transformers,
):
    skip_tree(_bookkeeping)
