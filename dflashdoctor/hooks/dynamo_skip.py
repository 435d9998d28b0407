"""Keep dynamo from compiling the instrumentation's own frames.

When dynamo gives up on a frame (a recompile limit, an error under `suppress_errors`) it runs that
frame as plain Python with its callback still set, so every Python function the frame calls is a
new frame dynamo tries to compile. The recorders' stand-ins sit between the user's code and
flex_attention: compiled as frames of their own they would turn a dense fallback fused (the tool
changing what it measures), and their bookkeeping (dataclasses, `sys._getframe`, `.item()`) would
show up as graph breaks in the user's report. So:
- a stand-in's frame is skipped and what it calls is left as it would be without it
  (`skip_frame`: the user's compiled wrapper, the raw flex_attention, run exactly as they would);
- bookkeeping is skipped with everything it calls (`skip_tree`).
Inlining is untouched: a stand-in called while dynamo traces a caller is traced as before.

Where this torch has no such control, nothing is skipped and nothing else changes. Nor is dynamo
imported for this: until the program imports it (a process that never compiles, an Inductor compile
worker, a data loader, never does; importing it costs about a second of CPU) the code objects wait,
and are marked as dynamo's frame evaluator finishes importing, before it can compile any frame.

Probed side: standard library and torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType
from typing import Any

from dflashdoctor.agent.post_import import when_imported

_EVAL_FRAME = "torch._dynamo.eval_frame"
_Setter = Callable[[CodeType, bool], None]


def _setter() -> _Setter | None:
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except Exception:  # another torch: no per-code strategy
        return None

    def set_strategy(code: CodeType, nested_too: bool) -> None:
        nested = FrameAction.SKIP if nested_too else FrameAction.DEFAULT
        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, nested))

    return set_strategy


class _Marks:
    """The code objects to skip, marked at once where dynamo is loaded, else once it is."""

    def __init__(self) -> None:
        self.setter: _Setter | None = None
        self.waiting: list[tuple[CodeType, bool]] | None = None  # None: dynamo loaded, marks go straight

    def mark(self, code: CodeType, nested_too: bool) -> None:
        if self.waiting is None and self.setter is None and _EVAL_FRAME not in sys.modules:
            self.waiting = []
            when_imported(_EVAL_FRAME, lambda _module: self._dynamo_loaded())
        if self.waiting is not None:
            self.waiting.append((code, nested_too))
            return
        if self.setter is None:
            self.setter = _setter() or _nothing
        _apply(self.setter, code, nested_too)

    def _dynamo_loaded(self) -> None:
        waiting, self.waiting = self.waiting or [], None
        self.setter = _setter() or _nothing
        for code, nested_too in waiting:
            _apply(self.setter, code, nested_too)


def _nothing(_code: CodeType, _nested_too: bool) -> None:
    """This torch has no per-code strategy: nothing is skipped."""


def _apply(setter: _Setter, code: CodeType, nested_too: bool) -> None:
    try:
        setter(code, nested_too)
    except Exception:  # a strategy this torch refuses: left as it was
        return


_MARKS = _Marks()


def _code(fn: Any) -> CodeType | None:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code if isinstance(code, CodeType) else None


def skip_frame(fn: Any) -> None:
    """dynamo never compiles `fn`'s frame; the frames it calls are compiled or not as without it."""
    code = _code(fn)
    if code is not None:
        _MARKS.mark(code, False)


def skip_tree(fn: Any) -> None:
    """dynamo never compiles `fn`'s frame nor any frame it calls (bookkeeping only)."""
    code = _code(fn)
    if code is not None:
        _MARKS.mark(code, True)
