"""Records attention calls inside a transformers model: which module, through which implementation.

Two sources, both restored on exit:
- every function registered in transformers' `AttentionInterface` (sdpa, flex_attention, flash...)
  is wrapped for the duration: models look it up at call time, so the wrapper sees each call with
  the calling module, whose dotted name comes from `model.named_modules()`;
- forward hooks on attention modules (softmax attention and linear attention alike) count the
  calls that never reach the interface, such as eager attention or gated DeltaNet layers.

Inside an outer torch.compile region the wrapper only forwards, so that dynamo traces no bookkeeping
and inserts no graph break; the call is listed at trace time instead (compiled_calls.py).

Probed side: standard library, torch and transformers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from dflashdoctor.hooks.call_stats import CallStats
from dflashdoctor.hooks.compiled_calls import comptime, traced_call, traced_tensor
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.module_names import ModuleNamer

_ATTENTION_MODULE = re.compile(r"(Attention|DeltaNet|Mamba|LinearAttn)$")


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


def kernel_impl(module: torch.nn.Module) -> str | None:
    """What a transformers layer's hub-kernel functions resolve to: an FLA kernel or the torch fallback.

    transformers decorates functions such as `torch_chunk_gated_delta_rule` so that, at import,
    they bind the original package's kernel when it imports and the torch code otherwise; the choice
    sits in the wrapper's closure as `implementation`. None when the module's file has no such function.
    """
    home = sys.modules.get(type(module).__module__)
    packages = set()
    for value in vars(home).values() if home else ():
        closure = getattr(value, "__closure__", None)
        if not callable(value) or not hasattr(value, "__wrapped__") or not closure:
            continue
        free = dict(zip(value.__code__.co_freevars, (cell.cell_contents for cell in closure), strict=False))
        implementation = free.get("implementation")
        if implementation is not None:
            packages.add((getattr(implementation, "__module__", "") or "").split(".")[0])
    kernels = sorted(p for p in packages if p and p != "transformers")
    if kernels:
        return " + ".join(f"{p} kernel" for p in kernels)
    return "torch fallback" if packages else None


class HFAttentionRecorder:
    def __init__(self, model: torch.nn.Module | None, dense: DenseFlexRecorder, namer: ModuleNamer) -> None:
        """`model` None: record interface calls only (a user script, whose models we do not know)."""
        self.model = model
        self.dense = dense
        self.namer = namer
        self.sites: dict[tuple[str, str], SiteRecord] = {}
        self.unavailable: str | None = None
        self._saved: dict[str, Callable[..., Any]] = {}
        self._hooks: list[Any] = []
        self._interface: Any = None
        self._via_interface: set[int] = set()

    def __enter__(self) -> HFAttentionRecorder:
        try:
            from transformers.modeling_utils import AttentionInterface
        except ImportError as exc:
            self.unavailable = f"transformers has no AttentionInterface here: {exc}"
        else:
            mapping = getattr(AttentionInterface, "_global_mapping", None)
            if isinstance(mapping, dict):
                self._interface = mapping
                for key, fn in list(mapping.items()):
                    self._saved[key] = fn
                    mapping[key] = self._wrap(key, fn)
            else:
                self.unavailable = "AttentionInterface has no _global_mapping on this transformers"
        for module in self.model.modules() if self.model is not None else ():
            if is_attention_module(module):
                self._hooks.append(module.register_forward_hook(self._module_called))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._interface is not None:
            self._interface.update(self._saved)
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def _site(self, module: torch.nn.Module, impl: str) -> SiteRecord:
        name = self.namer.name(module, sys._getframe(2))
        key = (name, impl)
        if key not in self.sites:
            self.sites[key] = SiteRecord(module=name, module_class=type(module).__name__, impl=impl)
        return self.sites[key]

    def _wrap(self, impl: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def note_traced_call(ctx: Any) -> None:  # dynamo calls it at trace time, through comptime
            call = traced_call(ctx, self.dense.skip_prefixes, module_local="module")
            if call is None or call.module is None:
                return
            name = self.namer.name(call.module, sys._getframe())
            key = (name, impl, "traced")
            if key not in self.sites:
                self.sites[key] = SiteRecord(
                    module=name,
                    module_class=type(call.module).__name__,
                    impl=impl,
                    file=call.file,
                    line=call.line,
                    function=call.function,
                )
            self.sites[key].observe_traced(call.backend, traced_tensor(ctx, "query"), traced_tensor(ctx, "key"))

        def recording_attention(module, query, key, value, attention_mask, *args, **kwargs):
            if torch.compiler.is_compiling():
                if comptime is not None:
                    comptime(note_traced_call)
                return fn(module, query, key, value, attention_mask, *args, **kwargs)
            before = self.dense.mark()
            result = fn(module, query, key, value, attention_mask, *args, **kwargs)
            self._via_interface.add(id(module))
            site = self._site(module, impl)
            if site.file is None:
                caller = sys._getframe(1)
                site.file, site.line, site.function = caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name
            dense = self.dense.events_since(before)
            site.observe(query, key, attention_mask, training=bool(module.training), dense=dense)
            self.dense.watch_backward(result, site)
            return result

        recording_attention.__wrapped__ = fn  # type: ignore[attr-defined]
        return recording_attention

    def _module_called(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """Calls that never reached the interface: eager attention, linear-attention layers."""
        if id(module) in self._via_interface:
            return
        site = self._site(module, "module-forward")
        site.training = bool(module.training)
        site.calls += 1
