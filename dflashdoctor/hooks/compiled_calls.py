"""Attention calls made inside an outer torch.compile region, seen while dynamo traces them.

At run time such a call is part of a compiled graph: no Python runs at it, and bookkeeping code
there would either be traced into the graph or break it. Dynamo's `comptime` instead runs a
function once, at trace time, with the user backtrace dynamo is tracing; it adds nothing to the
graph and installs no guard. Eagerly, the recorders never call it. Guarded: a torch without
comptime, or a backtrace that does not parse, records nothing. `comptime` is read from dynamo as
dynamo finishes importing (only inside a compiled region is it called, and dynamo is loaded there):
a process that never compiles does not import dynamo for it.

Probed side: standard library and torch.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from typing import Any

from dflashdoctor.agent.post_import import when_imported

comptime: Any = None  # dynamo's, once loaded; the recorders read it as `compiled_calls.comptime`


def _dynamo_loaded(_module: Any) -> None:
    global comptime
    try:
        from torch._dynamo.comptime import comptime as dynamo_comptime
    except ImportError:  # a torch without dynamo's comptime: outer-region calls go unlisted
        return
    comptime = dynamo_comptime


when_imported("torch._dynamo", _dynamo_loaded)

_HOOKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the recorders' own frames
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


@dataclass(frozen=True)
class TracedCall:
    file: str
    line: int
    function: str
    module: Any  # the innermost nn.Module whose forward dynamo was tracing at the call, if any
    backend: str | None  # the outer region's torch.compile backend, which compiles this call too


def traced_call(ctx: Any, skip_prefixes: tuple[str, ...], module_local: str | None = None) -> TracedCall | None:
    """The innermost traced frame outside `skip_prefixes`, and the module calling from there.

    The module is the local `module_local` of the innermost traced frame when given (transformers'
    attention functions take the module as an argument), else the nearest `self` that is a module,
    from the call site outwards.
    """
    buffer = io.StringIO()
    try:
        ctx.print_bt(file=buffer)
    except Exception:  # comptime's internals moved: record nothing rather than break the compile
        return None
    frames = list(reversed(_FRAME.findall(buffer.getvalue())))  # innermost first
    for depth, (file, line, function) in enumerate(frames):
        if not os.path.abspath(file).startswith((_HOOKS_DIR, *skip_prefixes)) and not file.startswith("<"):
            module = _module_local(ctx, module_local, 0) if module_local else _calling_module(ctx, depth, len(frames))
            return TracedCall(file, int(line), function, module, _backend(ctx))
    return None


def traced_tensor(ctx: Any, name: str) -> tuple[list[int | str], str] | None:
    """Shape (symbolic sizes as text) and dtype of a tensor local of the innermost traced frame."""
    try:
        fake = ctx.get_local(name).as_fake()
    except Exception:  # not a tensor, or dynamo's internals moved
        return None
    shape = [size if isinstance(size, int) else str(size) for size in fake.shape]
    return shape, str(fake.dtype).replace("torch.", "")


def _backend(ctx: Any) -> str | None:
    """The name of the backend dynamo hands the graph to: "inductor", "eager", "aot_eager"..."""
    try:
        compiler = ctx._i_will_not_complain_if_bc_breaks_InstructionTranslator().output.compiler_fn
    except Exception:  # dynamo's internals moved
        return None
    inner = getattr(compiler, "_torchdynamo_orig_backend", compiler)  # unwrap dynamo's debug wrapper
    name = getattr(inner, "compiler_name", None) or getattr(compiler, "__name__", None)
    return name if isinstance(name, str) else None


def _module_local(ctx: Any, name: str, level: int) -> Any:
    import torch

    try:
        tracker = ctx.get_local(name, stacklevel=level)._i_will_not_complain_if_bc_breaks_VariableTracker()
    except Exception:  # no such local at that level, or dynamo's internals moved
        return None
    value = getattr(tracker, "value", None)
    return value if isinstance(value, torch.nn.Module) else None


def _calling_module(ctx: Any, depth: int, frames: int) -> Any:
    for level in range(depth, frames):
        module = _module_local(ctx, "self", level)
        if module is not None:
            return module
    return None
