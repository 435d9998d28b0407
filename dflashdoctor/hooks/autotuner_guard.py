"""Watches triton autotuners for two threads inside one instance at once, and can serialize them.

triton's `Autotuner.run` keeps per-call state on the shared instance (`self.nargs`, set at entry,
read while benchmarking, set to None at the end) with no lock; FLA's `CachedAutotuner` inherits it
through `super().run`. Two threads in one instance corrupt each other, or crash with `TypeError:
'NoneType' object is not a mapping`, but only when their calls overlap, so a run that happens not
to crash says nothing. This guard wraps `Autotuner.run` on the class (every instance, also FLA's
subclass) and records each entry into an instance another thread is already inside: kernel name,
both threads, both stacks, and whether each call was cold (about to tune) or warm. With
`serialize=True` it also takes a per-instance re-entrant lock around the call (re-entrant because
subclasses call `super().run`), which is the in-process fix.

Usage in a trainer::

    from dflashdoctor.hooks import AutotunerGuard

    with AutotunerGuard(serialize=False) as guard:
        train()
    for event in guard.events:
        print(event.kernel, event.threads)

Probed side: standard library and triton only. Restores `Autotuner.run` on exit; a triton without
that class or method leaves the guard inactive with the reason in `unavailable`.
"""

from __future__ import annotations

import functools
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

_STACK_LIMIT = 12


@dataclass
class ConcurrentEntry:
    """One thread entering an autotuner instance while another thread was inside it."""

    kernel: str
    threads: list[str]  # [inside, entering]
    stacks: list[list[str]]  # the same order; each innermost frame last
    cold: list[bool | None]  # is each call's key still uncached at the overlap (tuning)? None: unknown
    serialized: bool  # the entering thread then waited for the lock instead of overlapping

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Inside:
    """A call in progress. Its coldness is worked out only if another thread overlaps it, so a call
    nobody overlaps pays for nothing but this record."""

    thread: threading.Thread
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    depth: int = 1


@dataclass
class _InstanceState:
    lock: threading.RLock = field(default_factory=threading.RLock)
    inside: dict[int, _Inside] = field(default_factory=dict)  # thread ident -> its call


def kernel_name(tuner: Any) -> str:
    base = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
    return getattr(base, "__name__", None) or type(tuner).__name__


def _is_cold(tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """Whether this call's tuning key is not cached yet, computed the way `Autotuner.run` does."""
    try:
        if len(tuner.configs) <= 1:
            return False
        named = {**dict(zip(tuner.arg_names, args, strict=False)), **kwargs}
        named = {k: v for k, v in named.items() if k in tuner.arg_names}
        key = [named[k] for k in tuner.keys if k in named]
        key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        return tuple(key) not in tuner.cache
    except Exception:  # another triton's layout: say unknown rather than guess
        return None


def _format(frames: traceback.StackSummary) -> list[str]:
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames][-_STACK_LIMIT:]


class AutotunerGuard:
    def __init__(self, serialize: bool = False) -> None:
        self.serialize = serialize
        self.events: list[ConcurrentEntry] = []
        self.entries = 0
        self.unavailable: str | None = None
        self._states: weakref.WeakKeyDictionary[Any, _InstanceState] = weakref.WeakKeyDictionary()
        self._book = threading.Lock()  # guards _states and events, held only for bookkeeping
        self._cls: Any = None
        self._original: Callable[..., Any] | None = None

    def __enter__(self) -> AutotunerGuard:
        try:
            from triton.runtime.autotuner import Autotuner
        except Exception as exc:  # no triton, or one without the autotuner module
            self.unavailable = f"triton.runtime.autotuner.Autotuner is not importable: {exc}"
            return self
        original = Autotuner.__dict__.get("run")
        if not callable(original):
            self.unavailable = "triton's Autotuner has no run method of its own on this version"
            return self
        self._cls, self._original = Autotuner, original
        Autotuner.run = self._guarded(original)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._cls is not None:
            self._cls.run = self._original
            self._cls = None

    def _guarded(self, run: Callable[..., Any]) -> Callable[..., Any]:
        guard = self

        @functools.wraps(run)
        def guarded_run(tuner: Any, *args: Any, **kwargs: Any) -> Any:
            me = threading.get_ident()
            state = guard._enter(tuner, me, args, kwargs)
            try:
                if guard.serialize:
                    with state.lock:
                        return run(tuner, *args, **kwargs)
                return run(tuner, *args, **kwargs)
            finally:
                guard._leave(state, me)

        return guarded_run

    def _enter(self, tuner: Any, me: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _InstanceState:
        with self._book:
            self.entries += 1
            state = self._states.get(tuner)
            if state is None:
                state = self._states[tuner] = _InstanceState()
            mine = state.inside.get(me)
            if mine is not None:  # a subclass calling super().run: the same call, one level deeper
                mine.depth += 1
                return state
            others = list(state.inside.items())
            state.inside[me] = _Inside(threading.current_thread(), args, kwargs)
        for ident, other in others:
            self._record(tuner, ident, other, _is_cold(tuner, args, kwargs))
        return state

    def _leave(self, state: _InstanceState, me: int) -> None:
        with self._book:
            mine = state.inside[me]
            mine.depth -= 1
            if mine.depth == 0:
                del state.inside[me]

    def _record(self, tuner: Any, ident: int, other: _Inside, cold: bool | None) -> None:
        frame = sys._current_frames().get(ident)
        their_stack = _format(traceback.extract_stack(frame)) if frame is not None else []
        my_stack = _format(traceback.extract_stack(sys._getframe(3)))
        event = ConcurrentEntry(
            kernel=kernel_name(tuner),
            threads=[other.thread.name, threading.current_thread().name],
            stacks=[their_stack, my_stack],
            # The call inside is cold if its key is still not cached: it is tuning right now.
            cold=[_is_cold(tuner, other.args, other.kwargs), cold],
            serialized=self.serialize,
        )
        with self._book:
            self.events.append(event)
