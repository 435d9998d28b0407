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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflashdoctor.records import ConcurrentEntryRecord

_STACK_LIMIT = 12


@dataclass
class ConcurrentEntry:
    """One thread entering an autotuner instance while another thread was inside it."""

    kernel: str
    threads: list[str]  # [inside, entering]
    stacks: list[list[str]]  # the same order; each innermost frame last
    cold: list[bool | None]  # is each call's key still uncached at the overlap (tuning)? None: unknown
    serialized: bool  # the entering thread then waited for the lock instead of overlapping

    def to_dict(self) -> ConcurrentEntryRecord:
        return {
            "kernel": self.kernel,
            "threads": list(self.threads),
            "stacks": [list(stack) for stack in self.stacks],
            "cold": list(self.cold),
            "serialized": self.serialized,
        }


class _Inside:
    """A call in progress. Its coldness is worked out only if another thread overlaps it, so a call
    nobody overlaps pays for nothing but this record."""

    __slots__ = ("args", "depth", "kwargs")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args, self.kwargs, self.depth = args, kwargs, 1


class _InstanceState:
    """Per autotuner: its lock (for serialize) and the calls inside it, by thread ident. Only a
    thread itself adds, deepens or removes its own entry, and single dict operations are atomic,
    so the warm path takes no lock of ours."""

    __slots__ = ("inside", "lock", "tuner")

    def __init__(self, tuner: Any) -> None:
        self.tuner = tuner  # held, so that its id is not reused while the guard is active
        self.lock = threading.RLock()
        self.inside: dict[int, _Inside] = {}


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
        self.unavailable: str | None = None
        self.unrecorded = 0  # overlaps seen but not recorded (recording itself failed)
        self._states: dict[int, _InstanceState] = {}  # id(tuner) -> state; the state holds the tuner
        self._book = threading.Lock()  # guards new states and events, held only off the warm path
        self._cls: Any = None
        self._original: Callable[..., Any] | None = None

    def kernels_entered(self) -> list[str]:
        """Every autotuned kernel called while the guard was on: the inventory of a run's autotuners."""
        return sorted({kernel_name(state.tuner) for state in list(self._states.values())})

    def calls_inside(self) -> int:
        """Autotuner calls in progress right now, over every instance (what a watchdog would read)."""
        return sum(len(state.inside) for state in list(self._states.values()))

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
        Autotuner.run = self._guarded(original)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._cls is not None:
            self._cls.run = self._original
            self._cls = None

    def _guarded(self, run: Callable[..., Any]) -> Callable[..., Any]:
        guard = self
        get_ident = threading.get_ident

        @functools.wraps(run)
        def guarded_run(tuner: Any, *args: Any, **kwargs: Any) -> Any:
            me = get_ident()
            state = guard._states.get(id(tuner)) or guard._new_state(tuner)
            guard._enter(tuner, state, me, args, kwargs)
            try:
                if guard.serialize:
                    with state.lock:
                        return run(tuner, *args, **kwargs)
                return run(tuner, *args, **kwargs)
            finally:
                mine = state.inside[me]
                mine.depth -= 1
                if mine.depth == 0:
                    del state.inside[me]

        return guarded_run

    def _new_state(self, tuner: Any) -> _InstanceState:
        with self._book:
            return self._states.setdefault(id(tuner), _InstanceState(tuner))

    def _enter(self, tuner: Any, state: _InstanceState, me: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        inside = state.inside
        mine = inside.get(me)
        if mine is not None:  # a subclass calling super().run: the same call, one level deeper
            mine.depth += 1
            return
        inside[me] = _Inside(args, kwargs)
        if len(inside) > 1:  # every thread adds itself before it looks, so one of two always sees the other
            try:
                cold = _is_cold(tuner, args, kwargs)
                for ident, other in list(inside.items()):
                    if ident != me:
                        self._record(tuner, ident, other, cold)
            except Exception:  # recording must never break the kernel call it watches
                self.unrecorded += 1

    def _record(self, tuner: Any, ident: int, other: _Inside, cold: bool | None) -> None:
        frame = sys._current_frames().get(ident)
        their_stack = _format(traceback.extract_stack(frame)) if frame is not None else []
        my_stack = _format(traceback.extract_stack(sys._getframe(3)))
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        event = ConcurrentEntry(
            kernel=kernel_name(tuner),
            threads=[names.get(ident, str(ident)), threading.current_thread().name],
            stacks=[their_stack, my_stack],
            # The call inside is cold if its key is still not cached: it is tuning right now.
            cold=[_is_cold(tuner, other.args, other.kwargs), cold],
            serialized=self.serialize,
        )
        with self._book:
            self.events.append(event)
