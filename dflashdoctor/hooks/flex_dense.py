"""Records every call of flex_attention's dense (unfused) kernels, where they execute.

Warnings fire once per process and dynamo's silent fallbacks emit none, so the only reliable signal
is the kernel itself: the higher-order ops `flex_attention` and `flex_attention_backward` keep their
dense Python kernels in `py_kernels[DispatchKey.CompositeExplicitAutograd]`. We swap those entries
for recording wrappers and clear each op's dispatch cache so the swap takes effect; Inductor-compiled
calls never reach them. Everything is guarded by the shape of the objects and restored on exit.

A dense backward runs on the autograd engine's thread, where no user frame is on the stack. The
call-site recorders therefore hang a gradient hook on each forward output (`watch_backward`): it
fires just before the backward of that call, and names the forward site the next dense backward
kernel belongs to.

Probed side: standard library and torch only.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from dflashdoctor.observations import DenseEvent

_HOP_MODULE = "torch._higher_order_ops.flex_attention"
_HOP_NAMES = {"flex_attention": "forward", "flex_attention_backward": "backward"}
_SCORE_BYTES_PER_ELEMENT = 4  # the dense kernels build scores in float32 whatever the input dtype
_STACK_DEPTH = 6
_FIRST_TORCH_WITH_FLEX = (2, 5)


class BackwardOwner(Protocol):
    """A forward call site that a later dense backward event can be charged to."""

    q_shape: list[int]

    def charge_backward(self, event: DenseEvent) -> dict[str, Any]:
        """Count the event; return where the forward call was made."""
        ...


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _user_frames(frame: FrameType | None, skip_prefixes: tuple[str, ...]) -> list[FrameType]:
    frames = []
    while frame is not None and len(frames) < _STACK_DEPTH:
        filename = os.path.abspath(frame.f_code.co_filename)
        # "<eval_with_key>" and similar are generated code (FX graphs of dynamo's eager backend).
        if not filename.startswith(skip_prefixes) and not frame.f_code.co_filename.startswith("<"):
            frames.append(frame)
        frame = frame.f_back
    return frames


def _site(frame: FrameType) -> dict[str, Any]:
    return {
        "file": frame.f_code.co_filename,
        "line": frame.f_lineno,
        "function": frame.f_code.co_name,
        "module": frame.f_globals.get("__name__"),
    }


def _score_bytes(q_shape: list[int], kv_shape: list[int]) -> int:
    if len(q_shape) != 4 or len(kv_shape) != 4:
        return 0
    batch, q_heads, q_len, _ = q_shape
    return batch * q_heads * q_len * kv_shape[2] * _SCORE_BYTES_PER_ELEMENT


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
    ) -> None:
        """`skip_files`: harness files (a probe) that should never be named as the call site.

        `measure_memory` resets the CUDA allocator's peak around each dense kernel to measure what
        the kernel added: right for a probe's own process, wrong for a user's run that reads its own
        peaks, so it is off by default. `on_event` sees each event before its kernel runs (`run`
        logs it at once, and under --strict raises instead of running the kernel). `max_events`
        bounds the list for long runs: past it, the older half is dropped (counted in `dropped`).
        """
        self.on_event = on_event
        self.max_events = max_events
        self.dropped = 0
        self.events: list[DenseEvent] = []
        self.phase = ""
        self.unavailable: str | None = None
        self.measure_memory = measure_memory
        # Per thread: the gradient hook and the backward kernel it announces run on the same autograd
        # thread (one per device), and data-parallel pairs backpropagate on several at once.
        self._backward_owner: dict[int, BackwardOwner] = {}
        self._saved: list[tuple[Any, Any, Callable[..., Any]]] = []
        self.skip_prefixes = (
            os.path.abspath(__file__),
            _torch_dir(),
            os.path.abspath(threading.__file__),
            *(os.path.abspath(f) for f in skip_files),
        )

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
            if not isinstance(kernels, dict) or key not in kernels:
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

    def mark(self) -> int:
        """A position in the stream of events, for `events_since` (stable when old events are dropped)."""
        return self.dropped + len(self.events)

    def events_since(self, before: int) -> list[DenseEvent]:
        """This thread's events after `before` (a `mark()`): other threads (data-parallel pairs in a
        thread pool) append their own kernels to the same list meanwhile."""
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
        return recording_kernel

    def _record(self, kind: str, args: tuple[Any, ...]) -> DenseEvent:
        query, key = (*args, None, None)[:2]
        q_shape = list(getattr(query, "shape", ()))
        kv_shape = list(getattr(key, "shape", ()))
        frames = _user_frames(sys._getframe(2), self.skip_prefixes)
        event = DenseEvent(
            kind=kind,
            phase=self.phase,
            q_shape=q_shape,
            kv_shape=kv_shape,
            dtype=str(getattr(query, "dtype", "")).replace("torch.", ""),
            device=str(getattr(query, "device", "")),
            score_matrix_bytes=_score_bytes(q_shape, kv_shape),
            site=_site(frames[0]) if frames else None,
            stack=[f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}" for f in frames],
            thread=threading.current_thread().name,
        )
        self.events.append(event)
        if self.max_events is not None and len(self.events) > self.max_events:
            half = len(self.events) // 2
            del self.events[:half]
            self.dropped += half
        return event

    def _charge_backward(self, event: DenseEvent) -> None:
        owner = self._backward_owner.pop(threading.get_ident(), None)
        # The shape check keeps a fused call's spent hook from claiming an unrecorded call's backward.
        if owner is not None and owner.q_shape == event.q_shape:
            event.forward_site = owner.charge_backward(event)
