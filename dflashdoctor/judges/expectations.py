"""Judges a block of the user's own test (`dflashdoctor.testing`): its observations in, findings out.

The causes and fixes are the other judges' own (dense_cause.py, autotuners.py), so a failing test
reads like `dflashdoctor check-compile` or `run` would on the same code.
"""

from __future__ import annotations

from dflashdoctor.codes import finding
from dflashdoctor.judges.autotuners import concurrent_entry_findings
from dflashdoctor.judges.base import size_text
from dflashdoctor.judges.dense_cause import FIX_SKIPPED_FRAME, DenseCall, explain, recompile_limit
from dflashdoctor.judges.dynamo_causes import (
    frame_name,
    is_recompile_limit,
    is_skipped_frame,
    last_guard,
    raised_exception,
    why_the_guard_recompiles,
)
from dflashdoctor.observations import BlockObservations, DenseEvent
from dflashdoctor.records import CompileRecord
from dflashdoctor.report import Finding, Where


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _where(event: DenseEvent) -> Where | None:
    site = event.site
    if not site:
        return None
    return Where(file=site["file"], line=site["line"], function=site["function"], module=event.layer)


def _thread(event: DenseEvent) -> str:
    """A thread Python did not start (autograd's engine runs CUDA backwards on its own, which
    Python names `Dummy-N`) is said to be that."""
    if event.kind == "backward" and event.thread.startswith("Dummy-"):
        return f"autograd's engine thread ({event.thread})"
    return f"thread {event.thread}"


def _fallbacks(records: list[CompileRecord]) -> list[CompileRecord]:
    return [r for r in records if is_recompile_limit(r) or is_skipped_frame(r)]


def dense_cause(event: DenseEvent, block: BlockObservations) -> tuple[str, str]:
    """Why this dense kernel ran, and the fix: the cause model every judge uses, on the event's route
    and on dynamo's records, the block's own after those from before it."""
    call = DenseCall(
        route=event.route,
        known_file=event.site["file"] if event.site else None,
        disabled_at=event.disabled_at,
        stance=event.stance,
        recomputed=event.recomputed,
        stance_set_at=event.stance_set_at,
    )
    cause = explain(call, [*block.earlier_compiles, *block.compiles], [], dynamo_disabled=block.dynamo_disabled)
    return cause.summary, cause.fix


def dense_findings(block: BlockObservations) -> list[Finding]:
    """One finding per direction and call site (a layer's module where it is known)."""
    groups: dict[tuple[str, str | None, int | None, str | None, str | None], list[DenseEvent]] = {}
    for event in block.dense_events:
        site = event.site
        file, line, function = (site["file"], site["line"], site["function"]) if site else (None, None, None)
        key = (event.kind, file, line, function, event.layer)
        groups.setdefault(key, []).append(event)
    findings = []
    for (kind, *_), events in groups.items():
        first = events[0]
        cause, fix = dense_cause(first, block)
        name = first.layer or (first.site["function"] if first.site else None)
        threads = sorted({_thread(e) for e in events})
        of_forward = " (the backward of the forward called there)" if kind == "backward" and first.site else ""
        findings.append(
            finding(
                f"dense-{kind}",
                f"{name + ': ' if name else ''}flex_attention {kind} ran the dense kernel "
                f"({plural(len(events), 'call')}){of_forward}",
                detail=(
                    f"q {first.q_shape} kv {first.kv_shape} {first.dtype} on {first.device}, on "
                    f"{', '.join(threads)}; each call builds a "
                    f"float32 score matrix of {size_text(first.score_matrix_bytes)}. Cause: {cause}."
                ),
                where=_where(first),
                evidence={"calls": len(events), "first_event": first.to_dict()},
                fix=fix,
            )
        )
    return findings


def fallback_findings(block: BlockObservations) -> list[Finding]:
    """Each fallback dynamo recorded during the block; with none, the fallback from before it that
    the block's dense calls still ran under."""
    records = [*block.earlier_compiles, *block.compiles]
    fallbacks, when = _fallbacks(block.compiles), "during this block"
    eager_calls = sum(1 for e in block.dense_events if e.route == "compiled-eager")
    if not fallbacks and eager_calls:
        fallbacks, when = _fallbacks(block.earlier_compiles)[-1:], "before this block"
    then = f"{plural(eager_calls, 'dense flex_attention call')} in the block ran under it."
    findings = []
    for record in fallbacks:
        name = frame_name(record, records) or "a compiled frame"
        if is_recompile_limit(record):
            guard = last_guard(records, record, None)
            findings.append(
                finding(
                    "recompile-limit-fallback",
                    f"Recompile limit ({block.recompile_limit}) hit: dynamo runs `{name}` eagerly from now on",
                    detail=f"Dynamo recompiled `{name}` each time the guard `{guard.expression}` failed"
                    + (f" (source: `{guard.source}`)" if guard.source else "")
                    + f". {why_the_guard_recompiles(guard)}It gave up {when}; {then}",
                    where=guard.where,
                    evidence={"guard": guard.expression, "record": record},
                    fix=recompile_limit(records, record, [], None).fix,
                )
            )
        else:
            raised_at = f"{record.get('fail_user_frame_filename')}:{record.get('fail_user_frame_lineno')}"
            findings.append(
                finding(
                    "dynamo-skip-fallback",
                    f"An exception inside the compiled `{name}` frame made dynamo skip it for the process",
                    detail=f"The compiled frame raised {raised_exception(record)} at {raised_at} {when}. Dynamo "
                    f"runs that code eagerly from then on, also for fresh torch.compile wrappers; {then}",
                    where=Where(file=record.get("fail_user_frame_filename"), line=record.get("fail_user_frame_lineno")),
                    evidence={"record": record},
                    fix=FIX_SKIPPED_FRAME,
                )
            )
    return findings


def overlap_findings(block: BlockObservations) -> list[Finding]:
    return concurrent_entry_findings(block.autotuner_overlaps)
