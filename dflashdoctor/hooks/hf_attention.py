"""Records attention calls inside a transformers model: which module, through which implementation.

Two sources, both restored on exit:
- every function registered in transformers' `AttentionInterface` (sdpa, flex_attention, flash...)
  is wrapped for the duration: models look it up at call time, so the wrapper sees each call with
  the calling module, whose dotted name comes from `model.named_modules()`;
- forward hooks on attention modules (softmax attention and linear attention alike) count the
  calls that never reach the interface, such as eager attention or gated DeltaNet layers.

The attention layers of the model given, or, without one (a user's script, `run`), of every
transformers model built while recording (`PreTrainedModel.post_init` is wrapped: it runs once at the
end of each model's construction, so nothing is paid per step), are listed from the module tree as
they are built, and hooked; `layers()` says which ran, through what.

Inside an outer torch.compile region the wrapper and the hooks only forward, so that dynamo traces
no bookkeeping and inserts no graph break; the call is listed at trace time instead (compiled_calls.py).

Probed side: standard library, torch and transformers.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

import torch

from dflashdoctor.hooks import compiled_calls
from dflashdoctor.hooks.call_stats import CallStats
from dflashdoctor.hooks.compiled_calls import traced_call, traced_tensor
from dflashdoctor.hooks.dynamo_skip import skip_frame, skip_tree
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.module_names import ModuleNamer

_ATTENTION_MODULE = re.compile(r"(Attention|DeltaNet|Mamba|LinearAttn)$")
_MODULE_FORWARD = "module-forward"  # the impl of a call seen by a layer hook only: the layer's own forward
_LAYER_SITES_KEPT = 4096  # attention modules whose site is remembered by identity
TORCH_FALLBACK = "torch fallback"  # a linear-attention layer bound to transformers' own torch code


@dataclass(kw_only=True)
class SiteRecord(CallStats):
    """All calls of one module through one implementation."""

    module: str
    module_class: str
    impl: str
    file: str | None = None  # the line that called the attention function (the module's forward)
    line: int | None = None
    function: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_attention_module(module: torch.nn.Module) -> bool:
    return bool(_ATTENTION_MODULE.search(type(module).__name__))


def is_linear_attention_module(module: torch.nn.Module) -> bool:
    """Gated DeltaNet, linear attention and Mamba layers: no softmax attention, and a hub kernel of
    their own (FLA's, mamba-ssm's) or transformers' torch fallback."""
    name = type(module).__name__
    return is_attention_module(module) and any(part in name for part in ("DeltaNet", "Mamba", "Linear"))


def _closed_over(function: object, name: str) -> object | None:
    """The value a function's closure holds under `name`, if it has one."""
    closure = getattr(function, "__closure__", None)
    code = getattr(function, "__code__", None)
    if not callable(function) or not closure or code is None:
        return None
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in closure), strict=False)).get(name)


def _hub_wrapper(value: object) -> object | None:
    """transformers' fallback wrapper behind a module-level name. Up to 5.24 the name is the wrapper;
    from 5.25, where the `kernels` package is installed, it is a small nn.Module whose forward
    closes over the wrapper as `func`."""
    if isinstance(value, torch.nn.Module):
        value = _closed_over(type(value).forward, "func")
    return value if callable(value) and hasattr(value, "__wrapped__") else None


def kernel_impl(module: torch.nn.Module) -> str | None:
    """What a transformers layer's hub-kernel functions resolve to: an FLA kernel or the torch fallback.

    transformers decorates functions such as `torch_chunk_gated_delta_rule` so that, at import,
    they bind the original package's kernel when it imports and the torch code otherwise; the choice
    sits in the wrapper's closure as `implementation`. None when the module's file has no such function.
    """
    home = sys.modules.get(type(module).__module__)
    packages = set()
    for value in vars(home).values() if home else ():
        implementation = _closed_over(_hub_wrapper(value), "implementation")
        if implementation is not None:
            packages.add((getattr(implementation, "__module__", "") or "").split(".")[0])
    kernels = sorted(p for p in packages if p and p != "transformers")
    if kernels:
        return " + ".join(f"{p} kernel" for p in kernels)
    return TORCH_FALLBACK if packages else None


def _inside(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(f"{prefix}.")


def planned_layers(root: torch.nn.Module) -> list[tuple[torch.nn.Module, dict[str, Any]]]:
    """One row per attention layer of `root` (an attention module inside another one is part of it),
    read from the module tree before anything runs, with the module it describes.

    Each row: the layer's dotted name under `root`, its kind (the layer types of the config of the
    nearest transformers model holding it, else its class), and the implementation it is set up to
    use (a linear-attention layer's bound kernel, else that config's attention implementation).
    A step that raises later leaves every row in place; `HFAttentionRecorder.layers` says what ran.
    """
    from transformers.modeling_utils import PreTrainedModel

    owners: list[tuple[str, Any]] = []  # the transformers models holding the current module, outermost first
    outer: list[str] = []
    kernels: dict[type, str | None] = {}  # kernel_impl walks the layer's modeling module: once per class
    planned: list[tuple[torch.nn.Module, dict[str, Any]]] = []
    for name, module in root.named_modules():
        while owners and not _inside(name, owners[-1][0]):
            owners.pop()
        if isinstance(module, PreTrainedModel):
            owners.append((name, module.config))
        if not is_attention_module(module) or any(_inside(name, o) for o in outer):
            continue
        outer.append(name)
        config = owners[-1][1] if owners else None
        layer_types = getattr(config, "layer_types", None) or []
        index = getattr(module, "layer_idx", None)
        linear = is_linear_attention_module(module)
        kind = layer_types[index] if isinstance(index, int) and index < len(layer_types) else None
        kind = kind or ("linear_attention" if linear else "full_attention")
        if linear and type(module) not in kernels:
            kernels[type(module)] = kernel_impl(module)
        configured = (kernels[type(module)] if linear else None) or getattr(config, "_attn_implementation", None)
        row = {"module": name, "class": type(module).__name__, "kind": kind, "configured": configured}
        planned.append((module, row | {"impl": configured, "ran": False, "calls": 0}))
    return planned


class HFAttentionRecorder:
    def __init__(self, model: torch.nn.Module | None, dense: DenseFlexRecorder, namer: ModuleNamer) -> None:
        """`model` None: every transformers model built while recording is listed and hooked as it is
        built (a user script, `run`: their models are made after recording starts)."""
        self.model = model
        self.dense = dense
        self.namer = namer
        self.sites: dict[tuple[str, ...], SiteRecord] = {}
        self.unavailable: str | None = None
        self._saved: dict[str, Callable[..., Any]] = {}
        self._hooks: list[Any] = []
        self._interface: Any = None
        self._via_interface: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._hooked: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        # every attention layer listed, in the order built; a row outlives its model (a script's
        # model freed when its function returns is still reported)
        self._layers: list[dict[str, Any]] = []
        self._rows: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._post_init: tuple[type, Callable[..., Any]] | None = None
        self._layer_hook = self._make_layer_hook()
        self._calling = threading.local()  # per thread: how deep in interface calls (pairs run on threads)

    def __enter__(self) -> HFAttentionRecorder:
        try:
            from transformers.modeling_utils import AttentionInterface, PreTrainedModel
        except ImportError as exc:
            self.unavailable = f"transformers has no AttentionInterface here: {exc}"
            return self
        mapping = getattr(AttentionInterface, "_global_mapping", None)
        if isinstance(mapping, dict):
            self._interface = mapping
            for key, fn in list(mapping.items()):
                self._saved[key] = fn
                mapping[key] = self._wrap(key, fn)
        else:
            self.unavailable = "AttentionInterface has no _global_mapping on this transformers"
        if self.model is not None:
            self._adopt(self.model)
        else:
            self._watch_models(PreTrainedModel)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._interface is not None:
            self._interface.update(self._saved)
        if self._post_init is not None:
            owner, original = self._post_init
            owner.post_init = original  # type: ignore[attr-defined]
            self._post_init = None
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def in_interface_call(self) -> bool:
        """Whether this thread is inside an attention-interface call, which this recorder records:
        the flex-call recorder leaves transformers' compiled singleton called from there alone."""
        return getattr(self._calling, "depth", 0) > 0

    def layers(self) -> list[dict[str, Any]]:
        """Every attention layer listed, as it ran: the implementation that took its calls (for a
        layer hook, the kernel bound to the layer) and how many calls; a layer traced into a compiled
        graph ran with 0 eager calls. Fresh rows: `run` asks again at every snapshot."""
        rows = [dict(row) for row in self._layers]
        by_name = {row["module"]: row for row in rows}
        for site in list(self.sites.values()):
            row = by_name.get(site.module)
            if row is None:
                continue
            impl = row["configured"] if site.impl == _MODULE_FORWARD else site.impl
            row.update(ran=True, impl=impl, calls=row["calls"] + site.calls)
        return rows

    def _watch_models(self, owner: type) -> None:
        """Wraps `post_init`, which every transformers model calls once at the end of its `__init__`
        (an inner model, such as a causal LM's text model, before the outer one)."""
        original = owner.post_init  # type: ignore[attr-defined]
        adopt = self._adopt

        @functools.wraps(original)
        def post_init(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            result = original(model, *args, **kwargs)
            adopt(model)
            return result

        owner.post_init = post_init  # type: ignore[attr-defined]
        self._post_init = (owner, original)

    def _adopt(self, model: torch.nn.Module) -> None:
        """Lists the model's attention layers and hooks each attention module once. A model adopted
        again inside an outer one takes the outer model's names, in place; a failure here is recorded,
        never raised into the model's construction."""
        try:
            for module, row in planned_layers(model):
                known = self._rows.get(module)
                if known is not None:
                    known.update(row)
                    continue
                self._rows[module] = row
                self._layers.append(row)
            for module in model.modules():
                if is_attention_module(module) and module not in self._hooked:
                    self._hooked.add(module)
                    self._hooks.append(module.register_forward_hook(self._layer_hook))
        except Exception as exc:  # a model whose tree we misread must still build
            self.unavailable = f"attention layers of {type(model).__name__} not listed: {type(exc).__name__}: {exc}"

    def _site(self, module: torch.nn.Module, impl: str, frame: FrameType, *, traced: bool = False) -> SiteRecord:
        """The module's site through `impl`; a module seen for the first time gives its listed layer
        the name it runs under (a model inside the user's own module is named from there)."""
        name = self.namer.name(module, frame)
        key = (name, impl, "traced") if traced else (name, impl)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = SiteRecord(module=name, module_class=type(module).__name__, impl=impl)
            row = self._rows.get(module)
            if row is not None:
                row["module"] = name
        return site

    def _note_traced(self, impl: str) -> Callable[[Any], None]:
        """What dynamo calls at trace time, through comptime, for a call inside an outer compiled
        region: the call's site, with the region's backend and the shapes dynamo saw. A layer hook's
        call is noted only for a layer that does not call through the interface (noted before it)."""

        def note_traced_call(ctx: Any) -> None:
            call = traced_call(ctx, self.dense.skip_prefixes, module_local="module")
            if call is None or call.module is None:
                return
            if impl != _MODULE_FORWARD:
                self._via_interface.add(call.module)
            elif call.module in self._via_interface:
                return
            site = self._site(call.module, impl, sys._getframe(), traced=True)
            if site.file is None:
                site.file, site.line, site.function = call.file, call.line, call.function
            site.observe_traced(call.backend, traced_tensor(ctx, "query"), traced_tensor(ctx, "key"))

        return note_traced_call

    def _wrap(self, impl: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        note_traced_call = self._note_traced(impl)

        def recording_attention(module, query, key, value, attention_mask, *args, **kwargs):
            if torch.compiler.is_compiling():
                if compiled_calls.comptime is not None:
                    compiled_calls.comptime(note_traced_call)
                return fn(module, query, key, value, attention_mask, *args, **kwargs)
            before = self.dense.mark()
            calling = self._calling
            calling.depth = getattr(calling, "depth", 0) + 1
            try:
                result = fn(module, query, key, value, attention_mask, *args, **kwargs)
            finally:
                calling.depth -= 1
            self._via_interface.add(module)
            site = self._site(module, impl, sys._getframe(1))
            if site.file is None:
                caller = sys._getframe(1)
                site.file, site.line, site.function = caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name
            dense = self.dense.events_since(before)
            site.observe(query, key, attention_mask, training=bool(module.training), dense=dense)
            if dense:  # flex's backward is dense exactly where its forward was: only then is it watched
                self.dense.watch_backward(result, site)
            return result

        recording_attention.__wrapped__ = fn  # type: ignore[attr-defined]
        skip_frame(recording_attention)  # transformers' attention below runs as it would without it
        return recording_attention

    def _make_layer_hook(self) -> Callable[[torch.nn.Module, Any, Any], None]:
        """The forward hook of attention modules: counts the calls that never reached the interface
        (eager attention, linear-attention layers). A plain function, so that dynamo, tracing it
        inside a compiled model, reaches comptime with the noting function as a constant."""
        note_traced_call = self._note_traced(_MODULE_FORWARD)
        layer_sites: dict[int, tuple[weakref.ref[torch.nn.Module], SiteRecord]] = {}

        def layer_called(module: torch.nn.Module, args: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                if compiled_calls.comptime is not None:
                    compiled_calls.comptime(note_traced_call)
                return
            if module in self._via_interface:
                return
            known = layer_sites.get(id(module))  # named once; a freed module's id reused is told apart
            if known is not None and known[0]() is module:
                site = known[1]
            else:
                site = self._site(module, _MODULE_FORWARD, sys._getframe(1))
                if len(layer_sites) >= _LAYER_SITES_KEPT:  # models made anew every step: stay bounded
                    layer_sites.clear()
                layer_sites[id(module)] = (weakref.ref(module), site)
            site.training = bool(module.training)
            site.calls += 1

        skip_tree(layer_called)
        return layer_called


skip_tree(HFAttentionRecorder._site)  # bookkeeping (dynamo_skip.py says why)
