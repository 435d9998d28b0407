"""The hooks every open block reads from, installed once per process.

The dense-kernel hook and the autotuner guard patch objects that the whole process shares (the
flex_attention higher-order ops, triton's `Autotuner.run`). Two blocks that each patched and
restored on their own would undo each other whenever they do not close in the reverse order they
opened, which blocks on two threads never promise. So the first block to open installs a hook, every
block takes a position in its stream of events, and the last to close restores what was patched.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflashdoctor.hooks.autotuner_guard import AutotunerGuard
    from dflashdoctor.hooks.flex_dense import DenseFlexRecorder

# Dense events kept while blocks are open; past it the older half goes (a block still counts them).
_MAX_DENSE_EVENTS = 10_000


class SharedHooks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dense: DenseFlexRecorder | None = None  # made once, installed while any block is open
        self._dense_users = 0
        self._guard: AutotunerGuard | None = None
        self._guard_users = 0

    def open_dense(self) -> DenseFlexRecorder:
        from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
        from dflashdoctor.hooks.module_names import ModuleNamer

        with self._lock:
            if self._dense is None:
                self._dense = DenseFlexRecorder(namer=ModuleNamer(), max_events=_MAX_DENSE_EVENTS)
            if self._dense_users == 0:
                self._dense.__enter__()
            self._dense_users += 1
            return self._dense

    def close_dense(self) -> None:
        with self._lock:
            self._dense_users -= 1
            dense = self._dense
            if self._dense_users == 0 and dense is not None:
                dense.restore()
                # Nobody reads the events any more; counted as dropped, the next block's marks stay apart.
                dense.dropped += len(dense.events)
                dense.events.clear()

    def open_guard(self) -> AutotunerGuard:
        from dflashdoctor.hooks.autotuner_guard import AutotunerGuard

        with self._lock:
            if self._guard is None:
                self._guard = AutotunerGuard(serialize=False).__enter__()
            self._guard_users += 1
            return self._guard

    def close_guard(self) -> None:
        with self._lock:
            self._guard_users -= 1
            if self._guard_users == 0 and self._guard is not None:
                self._guard.__exit__(None, None, None)
                self._guard = None


HOOKS = SharedHooks()
