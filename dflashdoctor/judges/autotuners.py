"""Two threads inside one triton autotuner, worded once for `run` and for `dflashdoctor.testing`."""

from __future__ import annotations

import os

from dflashdoctor.agent.process import is_user_file
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import frame_where
from dflashdoctor.records import ConcurrentEntryRecord
from dflashdoctor.report import Finding

_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # its stub kernel's frames
SHARED_AUTOTUNER_FIX = (
    "One process per GPU pair (torchrun) instead of threads; or run the target forwards one "
    "after another; or wrap training in dflashdoctor.hooks.AutotunerGuard(serialize=True). "
    "`dflashdoctor race` proves each fix."
)


def user_frame(frames: list[str]) -> str | None:
    """The innermost frame of the user's code, as the agent decides it for exceptions (frames
    `file:line in function`, innermost last); else the innermost."""
    mine = (f for f in reversed(frames) if is_user_file(f.rsplit(" in ", 1)[0].rsplit(":", 1)[0]))
    return next(mine, frames[-1] if frames else None)


def launch_frame(frames: list[str]) -> str | None:
    """The line that launched an autotuned kernel: the frame before triton's launcher (`jit.py`)."""
    launches = [i for i, f in enumerate(frames) if "/triton/runtime/jit.py:" in f]
    return frames[launches[0] - 1] if launches and launches[0] > 0 else user_frame(frames)


def _entered_from(frames: list[str], launched: str | None) -> str:
    """Where the second thread's own code called in, when that is not the launching line itself (a
    library's kernel wrapper launches; the team's pair called the library)."""
    outside = [f for f in frames if f != launched and _OWN_PACKAGE not in f]
    caller = user_frame(outside) if outside else None
    if caller is None or caller == launched or not is_user_file(caller.rsplit(" in ", 1)[0].rsplit(":", 1)[0]):
        return ""
    return f" It entered from {caller}."


def concurrent_entry_findings(overlaps: list[ConcurrentEntryRecord]) -> list[Finding]:
    """One `concurrent-autotuner-entry` per kernel, from the guard's records (`ConcurrentEntry.to_dict`)."""
    by_kernel: dict[str, list[ConcurrentEntryRecord]] = {}
    for overlap in overlaps:
        by_kernel.setdefault(overlap["kernel"], []).append(overlap)
    findings = []
    for kernel, events in by_kernel.items():
        first = events[0]
        findings.append(
            finding(
                "concurrent-autotuner-entry",
                f"Two threads inside the autotuner of `{kernel}` at once ({len(events)} times)",
                detail=f"Threads {first['threads'][0]} and {first['threads'][1]} were inside the same triton "
                "Autotuner instance together; its run() keeps per-call state on the instance, so they corrupt "
                f"each other (a crash or silently wrong tuning). Cold (tuning) at the overlap: {first['cold']}."
                + _entered_from(first["stacks"][1], launch_frame(first["stacks"][1])),
                where=frame_where(launch_frame(first["stacks"][1])),
                evidence={"overlaps": events[:4], "count": len(events)},
                fix=SHARED_AUTOTUNER_FIX,
            )
        )
    return findings
