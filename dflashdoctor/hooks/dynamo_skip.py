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

Where this torch has no such control, nothing is skipped and nothing else changes.

Probed side: standard library and torch.
"""

from __future__ import annotations

from collections.abc import Callable
from types import CodeType
from typing import Any


def _setter() -> Callable[[CodeType, bool], None] | None:
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except Exception:  # another torch: no per-code strategy
        return None

    def set_strategy(code: CodeType, nested_too: bool) -> None:
        nested = FrameAction.SKIP if nested_too else FrameAction.DEFAULT
        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, nested))

    return set_strategy


_SET = _setter()


def _code(fn: Any) -> CodeType | None:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code if isinstance(code, CodeType) else None


def skip_frame(fn: Any) -> None:
    """dynamo never compiles `fn`'s frame; the frames it calls are compiled or not as without it."""
    code = _code(fn)
    if _SET is not None and code is not None:
        try:
            _SET(code, False)
        except Exception:  # a strategy this torch refuses: left as it was
            return


def skip_tree(fn: Any) -> None:
    """dynamo never compiles `fn`'s frame nor any frame it calls (bookkeeping only)."""
    code = _code(fn)
    if _SET is not None and code is not None:
        try:
            _SET(code, True)
        except Exception:
            return
