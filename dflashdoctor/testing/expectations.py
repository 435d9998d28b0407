"""The assertions: a block that must stay fused, fall back nowhere, or share no autotuner.

Each is a context manager (and a decorator) around a `Recording`. On a clean exit it raises an
`ExpectationError` (an AssertionError, so pytest reports a failed test) whose message is the
finding a report would hold. A block that raises keeps its own exception: the expectation says
nothing over it, and the hooks are restored either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType

from dflashdoctor.judges.expectations import dense_findings, fallback_findings, overlap_findings, plural
from dflashdoctor.observations import BlockObservations
from dflashdoctor.report import Finding
from dflashdoctor.testing.message import message
from dflashdoctor.testing.recording import Recording


class ExpectationError(AssertionError):
    """A block broke what it was expected to keep; `findings` and `recording` say what happened."""

    def __init__(self, text: str, findings: list[Finding], recording: Recording) -> None:
        super().__init__(text)
        self.findings = findings
        self.recording = recording


class DenseAttentionError(ExpectationError):
    """flex_attention ran its dense (unfused) kernel, forward or backward, inside `expect_fused()`."""


class RecompileFallbackError(ExpectationError):
    """dynamo fell back to running a compiled frame eagerly inside `expect_no_recompile_fallback()`."""


class SharedAutotunerError(ExpectationError):
    """Two threads were inside one triton autotuner at once inside `expect_no_shared_autotuner()`."""


def _dense_headline(block: BlockObservations, _findings: list[Finding]) -> str:
    events = block.dense_events
    forward = sum(1 for e in events if e.kind == "forward")
    sites = {(e.site.get("file"), e.site.get("line"), e.layer) if e.site else (None, None, e.layer) for e in events}
    dropped = f" (and {block.dense_dropped} more not kept)" if block.dense_dropped else ""
    return (
        f"expect_fused: flex_attention ran its dense kernel {plural(len(events), 'time')}{dropped} "
        f"({forward} forward, {len(events) - forward} backward) from {plural(len(sites), 'call site')}"
    )


def _fallback_headline(_block: BlockObservations, findings: list[Finding]) -> str:
    return f"expect_no_recompile_fallback: dynamo ran compiled code eagerly ({plural(len(findings), 'fallback')})"


def _overlap_headline(block: BlockObservations, _findings: list[Finding]) -> str:
    overlaps = plural(len(block.autotuner_overlaps), "overlap")
    return f"expect_no_shared_autotuner: two threads inside one triton autotuner ({overlaps})"


_Check = tuple[
    type[ExpectationError],
    Callable[[BlockObservations], list[Finding]],
    Callable[[BlockObservations, list[Finding]], str],
]
# Each check: the error it raises, the judge of its findings, and its headline.
CHECKS: dict[str, _Check] = {
    "fused": (DenseAttentionError, dense_findings, _dense_headline),
    "no-recompile-fallback": (RecompileFallbackError, fallback_findings, _fallback_headline),
    "no-shared-autotuner": (SharedAutotunerError, overlap_findings, _overlap_headline),
}


def failure(recording: Recording, *checks: str) -> ExpectationError | None:
    """The error for the checks (keys of CHECKS) a finished block broke, or None. Where several are
    broken, the first one's class carries every message."""
    block = recording.observations()
    broken = []
    for name in checks:
        error_class, judge, headline = CHECKS[name]
        findings = judge(block)
        if findings:
            broken.append((error_class, findings, message(headline(block, findings), findings)))
    if not broken:
        return None
    text = "\n\n".join([*(part for _, _, part in broken), *(f"(not watched: {u})" for u in block.unavailable)])
    return broken[0][0](text, [f for _, findings, _ in broken for f in findings], recording)


class _Expectation(contextlib.AbstractContextManager["Recording"]):
    """One `with` block judged by `check` at its end. Entered a second time it says so, instead of
    contextlib's "generator didn't yield" or an AttributeError about its internals."""

    def __init__(self, function: str, check: str, *, autotuners: bool = False) -> None:
        self.function = function
        self.check = check
        self.autotuners = autotuners
        self._recording: Recording | None = None

    def __enter__(self) -> Recording:
        if self._recording is not None:
            raise RuntimeError(f"{self.function}() was entered already: call it again for each `with` block")
        self._recording = Recording(autotuners=self.autotuners).__enter__()
        return self._recording

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        recording = self._recording
        assert recording is not None
        recording.__exit__(exc_type, exc, tb)
        if exc_type is not None:  # the block's own exception goes on; the block was not judged
            return
        error = failure(recording, self.check)
        if error is not None:
            raise error


def _expect(check: str, *, autotuners: bool = False) -> _Expectation:
    return _Expectation(f"expect_{check.replace('-', '_')}", check, autotuners=autotuners)


def expect_fused() -> contextlib.AbstractContextManager[Recording]:
    """Fail when any flex_attention forward or backward runs its dense kernel inside the block, on
    any thread: raises DenseAttentionError naming each site, its shapes and cost, the cause and the fix."""
    return _expect("fused")


def expect_no_recompile_fallback() -> contextlib.AbstractContextManager[Recording]:
    """Fail when dynamo gives up on a compiled frame inside the block (the recompile limit hit, or an
    exception that got the frame skipped), or when a dense call runs under such a fallback from before."""
    return _expect("no-recompile-fallback")


def expect_no_shared_autotuner() -> contextlib.AbstractContextManager[Recording]:
    """Fail when a thread enters a triton autotuner another thread is inside (the race that corrupts
    FLA's and triton's autotuners), whether or not that overlap crashed this time."""
    return _expect("no-shared-autotuner", autotuners=True)
