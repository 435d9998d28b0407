"""What happened inside one block: dense flex_attention kernels, dynamo's compiles, autotuner overlaps.

A `Recording` is live while its block runs (a test may assert on it inside the block) and fixed
once the block ends. It counts every thread: a data-parallel pair on a thread pool, or the autograd
engine's device threads that run a dense backward, are part of the block they ran during. Work a
thread had begun before the block opened is not: a thread an earlier test left running, still in
its loop, is that test's (an idle pool worker that takes a job from the block is the block's).
"""

from __future__ import annotations

import itertools
import os
import sys
import sysconfig
import threading
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from dflashdoctor.observations import BlockObservations
from dflashdoctor.testing.shared_hooks import HOOKS

if TYPE_CHECKING:
    from dflashdoctor.hooks.autotuner_guard import AutotunerGuard
    from dflashdoctor.hooks.dynamo_watch import DynamoWatch
    from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
    from dflashdoctor.observations import DenseEvent
    from dflashdoctor.records import CompileRecord, ConcurrentEntryRecord
    from dflashdoctor.report import Finding


def _dynamo_config(name: str, default: Any) -> Any:
    import torch

    try:
        return getattr(torch._dynamo.config, name)
    except AttributeError:  # a torch without that setting
        return default


_BLOCKS = itertools.count(1)
_PATHS = sysconfig.get_paths()
_LIBRARY = tuple(
    os.path.join(os.path.abspath(p), "")
    for p in (_PATHS["stdlib"], _PATHS["platstdlib"], os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
_SITE = tuple(os.path.join(os.path.abspath(_PATHS[key]), "") for key in ("purelib", "platlib"))


def _library(filename: str) -> bool:
    """The standard library (a pool's worker loop, threading's bootstrap) or dflashdoctor itself:
    frames that are no one's work. Site-packages lie under the standard library's folder on most
    installs, and a library's frames there are work (a trainer's loop in a package)."""
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_LIBRARY) and not path.startswith(_SITE)


def _work_in_progress() -> dict[int, FrameType]:
    """For each other thread busy in someone's code, the outermost frame of that code: it stays on
    the thread's stack for as long as that work goes on. An idle pool worker (waiting in the
    standard library's queue) has none."""
    me = threading.get_ident()
    running = {}
    for ident, top in sys._current_frames().items():
        outermost = None
        frame: FrameType | None = top
        while ident != me and frame is not None:
            if not _library(frame.f_code.co_filename):
                outermost = frame
            frame = frame.f_back
        if outermost is not None:
            running[ident] = outermost
    return running


class Recording:
    """`autotuners`: also watch triton's autotuners for two threads inside one instance (imports
    triton; where triton is missing or changed, the reason is in `unavailable`)."""

    def __init__(self, *, autotuners: bool = False) -> None:
        self.autotuners = autotuners
        self.unavailable: list[str] = []
        self._dense: DenseFlexRecorder | None = None
        self._dense_mark = 0
        self._watch: DynamoWatch | None = None
        self._guard: AutotunerGuard | None = None
        self._guard_mark = 0
        self._final: BlockObservations | None = None
        self._block = next(_BLOCKS)

    def __enter__(self) -> Recording:
        from dflashdoctor.hooks.dynamo_watch import DynamoWatch

        if self._dense is not None:  # its marks would be reset under the first block
            raise RuntimeError("this recording was entered already: make a new one (record()) for each block")
        self._dense = HOOKS.open_dense()
        self._dense.watch_older_work(self._block, _work_in_progress())
        self._dense_mark = self._dense.mark()
        self._watch = DynamoWatch()
        if self.autotuners:
            self._guard = HOOKS.open_guard()
            self._guard_mark = len(self._guard.events)
        for hook in (self._dense, self._watch, self._guard):
            if hook is not None and hook.unavailable:
                self.unavailable.append(hook.unavailable)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._final = self.observations()
        finally:
            if self._dense is not None:
                self._dense.forget_older_work(self._block)
            HOOKS.close_dense()
            if self._guard is not None:
                HOOKS.close_guard()

    def observations(self) -> BlockObservations:
        """Everything the block saw so far (all of it, once the block has ended), as the judge reads it."""
        if self._final is not None:
            return self._final
        watch = self._watch
        if watch is not None:
            watch.collect("block")
        dense = self._dense
        guard = self._guard
        since = dense.events[max(0, self._dense_mark - dense.dropped) :] if dense else []
        events = [event for event in since if self._block not in event.older_than]
        return BlockObservations(
            dense_events=events,
            dense_dropped=max(0, dense.dropped - self._dense_mark) if dense else 0,
            compiles=list(watch.records) if watch else [],
            earlier_compiles=watch.earlier() if watch and events else [],  # they explain dense calls only
            autotuner_overlaps=[e.to_dict() for e in guard.events[self._guard_mark :]] if guard else [],
            dynamo_disabled=bool(_dynamo_config("disable", False)),
            recompile_limit=_dynamo_config("recompile_limit", _dynamo_config("cache_size_limit", None)),
            unavailable=list(self.unavailable),
        )

    @property
    def dense_events(self) -> list[DenseEvent]:
        """Every dense flex_attention kernel that ran during the block, on any thread, in order."""
        return self.observations().dense_events

    @property
    def fallbacks(self) -> list[CompileRecord]:
        """dynamo's compiles during the block that ended in running the frame eagerly: the recompile
        limit hit, or an exception that made dynamo skip the frame (hooks/dynamo_watch.py: fields)."""
        from dflashdoctor.judges.dynamo_causes import is_recompile_limit, is_skipped_frame

        return [r for r in self.observations().compiles if is_recompile_limit(r) or is_skipped_frame(r)]

    @property
    def autotuner_overlaps(self) -> list[ConcurrentEntryRecord]:
        """Each entry of a thread into a triton autotuner another thread was inside (`autotuners=True`)."""
        return self.observations().autotuner_overlaps

    def findings(self) -> list[Finding]:
        """What a report would say of the block: dense kernels with their cause, fallbacks, overlaps."""
        from dflashdoctor.judges.expectations import dense_findings, fallback_findings, overlap_findings

        block = self.observations()
        return [*dense_findings(block), *fallback_findings(block), *overlap_findings(block)]


def record(*, autotuners: bool = False) -> Recording:
    """The events of a block, without raising: `with record() as seen: ...; assert not seen.dense_events`."""
    return Recording(autotuners=autotuners)
