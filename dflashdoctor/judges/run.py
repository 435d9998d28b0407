"""Judges a `dflashdoctor run`: one section for the run as a whole, then one per process (per rank).

A process's attention sites, dense kernels and dynamo records are judged by trace-attention's rules
(its last snapshot has their shape); `run` adds what only a real run shows: uncaught exceptions with
the module they came from, out-of-memory forensics, two threads inside one autotuner, hangs with
every thread's stack, and the command's exit code. Every finding from one process carries its rank
and pid in the evidence.
"""

from __future__ import annotations

import itertools
import math
import signal
import statistics
from dataclasses import replace
from typing import Any

from dflashdoctor.agent.config import FINAL_SNAPSHOTS
from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.explain.diagnosis import diagnose_text, is_known
from dflashdoctor.judges.autotuners import concurrent_entry_findings, user_frame
from dflashdoctor.judges.base import Judge, frame_where, size_text
from dflashdoctor.judges.kernel_resources import OutOfResources, out_of_resources_finding
from dflashdoctor.judges.known_causes import known_cause
from dflashdoctor.judges.leftovers import left_running_finding
from dflashdoctor.judges.plots import step_plots
from dflashdoctor.judges.trace_attention import TraceAttentionJudge
from dflashdoctor.observations import DenseEvent, RunSnapshot, load
from dflashdoctor.probe_support import first_line
from dflashdoctor.records import (
    CallInFlight,
    DenseEventRecord,
    HangRecord,
    LeftRunningRecord,
    LoggedDense,
    SourceSite,
    Stacks,
    StepEvent,
)
from dflashdoctor.report import CheckStatus, ProbeResult, Where
from dflashdoctor.runs.events import ProcessLog
from dflashdoctor.runs.observations import RunObservations

_AGENT_THREAD = "dflashdoctor-sampler"
_STEPS_KEPT = 200


def _observations(log: ProcessLog) -> RunSnapshot:
    """The last snapshot, plus the dense kernels logged after it (a process killed before its final
    snapshot still names them); with no snapshot, the dense kernels alone."""
    snapshot = log.snapshot
    if snapshot is None:
        return RunSnapshot(dense_events=_dense(log.dense), dense_events_total=len(log.dense))
    if snapshot.reason in FINAL_SNAPSHOTS:
        return snapshot.observations
    later = _dense([e for e in log.dense if e["t"] > snapshot.t])
    total = snapshot.observations.dense_events_total + len(later)
    return replace(
        snapshot.observations, dense_events=[*snapshot.observations.dense_events, *later], dense_events_total=total
    )


def _dense(logged: list[LoggedDense]) -> list[DenseEvent]:
    """Logged dense kernels as the trace-attention judge reads them (the time they were logged is the
    reader's, not the event's)."""
    return [load(DenseEvent, {k: v for k, v in event.items() if k != "t"}, strict=True) for event in logged]


_TIMEOUT_FIX = (
    "Give the gate's command a way to stop after a few optimizer steps (the agent stops each process "
    "after run_steps optimizer.step() calls; a loop without an optimizer never reaches them), or raise run_timeout "
    "if it was only slow."
)


class ProcessJudge(Judge):
    def __init__(
        self,
        log: ProcessLog,
        hang_stacks: Stacks | None,
        stopped: bool,
        budgets: Budgets,
        deadline_s: float | None = None,
    ) -> None:
        super().__init__(log.label, budgets)
        self.log = log
        self.stopped = stopped
        self.hang_stacks = hang_stacks
        self.deadline_s = deadline_s  # the stacks were taken at the run's time limit, not for silence
        self.observations = _observations(log)

    def judge(self) -> ProbeResult:
        self._attention()
        self._exceptions()
        self._out_of_memory()
        self._autotuners()
        self._hang()
        self._ending()
        self.measurements.update(self._numbers())
        self._steps()
        self.plots = step_plots(self.log.steps, self.log.dense, self.log.ooms)
        for item in self.findings:
            item.evidence = {"rank": self.log.rank, "pid": self.log.pid, **item.evidence}
        return self.result()

    def _attention(self) -> None:
        if self.log.instrumented is None:
            self._check("instrumented", "info", "never imported torch: only its exceptions and stacks are watched")
            return
        traced = TraceAttentionJudge(self.observations, self.budgets).judge()
        self.findings += traced.findings
        self.checks += [c for c in traced.checks if c.name != "script"]
        self.measurements["call_sites"] = traced.measurements.get("call_sites", [])
        self.tables += traced.tables
        self.comparisons += traced.comparisons
        for key in ("graph_breaks", "graph_break_reasons"):
            self.measurements[key] = traced.measurements[key]
        for reason in self.observations.unavailable:
            self.findings.append(
                finding(
                    "instrumentation-unavailable",
                    "Part of run's instrumentation could not be installed here",
                    detail=reason,
                    fix="Report the versions to dflashdoctor; what the other hooks saw is still reported.",
                )
            )
        for error in self.log.agent_errors[:5]:
            self.findings.append(
                finding(
                    "instrumentation-unavailable",
                    f"dflashdoctor's agent failed at {error.get('what')}; the program ran on",
                    detail=str(error.get("error")),
                    evidence=dict(error),
                    fix="Report it to dflashdoctor with this evidence.",
                )
            )

    def _exceptions(self) -> None:
        seen = set()
        for exc in self.log.exceptions:
            key = (exc["type"], exc["message"], str(exc.get("where")))
            if key in seen or exc.get("oom") or (exc["type"] == "KeyboardInterrupt" and self.stopped):
                continue  # a KeyboardInterrupt of a run the doctor stopped is the stop itself
            seen.add(key)
            module = f" in {exc['module']}" if exc.get("module") else ""
            resources = OutOfResources.read(exc["message"], exc.get("traceback") or "")
            if resources is not None:
                where = _user_where(exc["where"], exc["module"])
                self.findings.append(out_of_resources_finding(resources, f"thread {exc['thread']}", where))
                continue
            known = known_cause(exc["message"], exc.get("raised_at"))
            evidence = {k: exc.get(k) for k in ("type", "message", "thread", "module", "raised_at", "traceback")}
            # its traceback read as `explain` reads a log: the class and the call path, worded once
            read = diagnose_text(exc.get("traceback") or "", self.log.rank) if not known else None
            classed = read if read is not None and is_known(read) else None
            if read is not None and read.path.owners:
                evidence |= {"call_path": read.evidence()["call_path"], "library": read.path.library}
            if classed is not None and classed.found is not None:
                evidence["log_class"] = classed.found.code
            self.findings.append(
                finding(
                    "uncaught-exception",
                    f"{exc['type']}{module} on thread {exc['thread']}: {first_line(exc['message'])[:200]}"
                    + (f"; {classed.title}" if classed else ""),
                    detail=f"Nothing caught it; it ended thread {exc['thread']}"
                    + (" and the process." if exc["thread"] == "MainThread" else ".")
                    + (f" It was raised inside module `{exc['module']}`." if exc.get("module") else "")
                    + (f" Known cause: {known.cause}" if known else "")
                    + (f" Read from its traceback: {classed.title}." if classed else "")
                    + (f" {read.path_story()}" if read is not None and read.path.owners else ""),
                    where=_user_where(exc["where"], exc["module"]),
                    evidence=evidence | ({"known_cause": known.name} if known else {}),
                    fix=known.fix
                    if known
                    else classed.fix()
                    if classed
                    else "Read the traceback in the evidence; the call sites and dense kernels seen before it "
                    "are listed in this section.",
                )
            )

    def _out_of_memory(self) -> None:
        raised = [e for e in self.log.exceptions if e["oom"]]
        if not self.log.ooms and not raised:
            return
        oom = self.log.ooms[0] if self.log.ooms else None
        exc = raised[0] if raised else None
        dense = (oom["dense_events"] if oom else []) or [event.to_record() for event in self.observations.dense_events]
        call = oom["in_flight"] if oom else None
        cause = self._oom_cause(call, dense)
        module = (call["module"] if call else None) or (exc["module"] if exc else None)
        where = _user_where(exc["where"] if exc else None, module)
        if call and call["file"]:
            where = Where(file=call["file"], line=call["line"], function=call["function"], module=module)
        if oom is not None:
            detail = (
                f"Asked for {size_text(oom['requested_bytes'])} on {oom['device']} with "
                f"{size_text(oom['free_bytes'])} free of {size_text(oom['device_total_bytes'])}, "
                f"after {oom['steps']} optimizer steps."
            )
            if oom["memory_snapshot"]:
                detail += f" Memory snapshot: {oom['memory_snapshot']} (open it at https://pytorch.org/memory_viz)."
        else:
            detail = f"{exc['type']}: {first_line(exc['message'])[:300]}" if exc else ""
        self.findings.append(
            finding(
                "oom",
                f"Out of memory{f' in {module}' if module else ''}: {cause}",
                detail=detail,
                where=where,
                evidence={
                    "allocator": {k: v for k, v in oom.items() if k not in ("last_calls", "dense_events", "in_flight")}
                    if oom
                    else {},
                    "call_in_flight": call,
                    "last_attention_calls": oom["last_calls"] if oom else [],
                    "dense_events_before": dense[-8:],
                    "traceback": exc["traceback"] if exc else None,
                },
                fix="If a dense flex_attention kernel is named, compile that call (a fused kernel never builds "
                "the score matrix); otherwise lower the batch or sequence, or rerun with --memory-snapshot and "
                "open the snapshot in PyTorch's memory viewer.",
            )
        )

    @staticmethod
    def _oom_cause(call: CallInFlight | None, dense: list[DenseEventRecord]) -> str:
        inside = f"{call['module'] or call['function']} ({call['file']}:{call['line']})" if call else None
        if not dense:
            if inside:
                return f"inside the flex_attention call of {inside}; see the allocator state"
            return "no dense flex_attention kernel ran before it; see the allocator state and the last calls"
        last = dense[-1]
        site = last["forward_site"] or last["site"]
        at = f"{site.get('module') or site['function']} ({site['file']}:{site['line']})" if site else inside
        return (
            f"the dense flex_attention {last['kind']} kernel of {at or 'an unrecorded call'} builds a float32 score "
            f"matrix of {size_text(last['score_matrix_bytes'])} per call"
        )

    def _autotuners(self) -> None:
        overlaps = self.observations.autotuner_overlaps
        self.findings.extend(concurrent_entry_findings(overlaps))
        if self.log.instrumented is not None:
            kernels = self.observations.autotuned_kernels
            status: CheckStatus = "fail" if overlaps else "pass"
            summary = f"{len(overlaps)} overlaps in {len(kernels)} autotuned kernels entered"
            self._check("autotuners", status, summary, "concurrent-autotuner-entry")

    def _hang(self) -> None:
        if self.hang_stacks is None:
            return
        threads = [t for t in self.hang_stacks.get("threads", []) if t["name"] != _AGENT_THREAD]
        threads = [t for t in threads if not any("dflashdoctor/agent/process.py" in f for f in t["frames"])]
        main = next((t for t in threads if t["name"] in ("MainThread",) or "current" in t["name"]), None)
        frame = user_frame(main["frames"]) if main and main["frames"] else None
        waits = "; ".join(f"{t['name']} at {user_frame(t['frames'])}" for t in threads if t["frames"]) or "unknown"
        tool = self.hang_stacks.get("tool", "?")
        note = f" ({self.hang_stacks['note']})" if self.hang_stacks.get("note") else ""
        evidence = {"threads": threads, "tool": self.hang_stacks.get("tool")}
        if self.deadline_s is not None:
            self.findings.append(
                finding(
                    "run-timeout",
                    f"{self.log.label} was still running at the time limit of {self.deadline_s:g} s",
                    detail=f"Every thread's stack was taken with {tool}{note} as it was stopped. Each thread was at: "
                    f"{waits}.",
                    where=frame_where(frame),
                    evidence={**evidence, "deadline_s": self.deadline_s},
                    fix=_TIMEOUT_FIX,
                )
            )
            return
        self.findings.append(
            finding(
                "hang",
                f"{self.log.label} made no progress; {len(threads)} threads were stuck",
                detail=f"Every thread's stack was taken with {tool}{note}. Each thread waited at: {waits}.",
                where=frame_where(frame),
                evidence=evidence,
                fix="Read the stacks: two threads each waiting for the other's lock is a deadlock; a collective "
                "(all_reduce, barrier) waiting on one rank means another rank took a different path.",
            )
        )

    def _ending(self) -> None:
        ending = self.log.exit["ending"] if self.log.exit else None
        if ending is None:
            ending = "stopped without an exit record (killed by a signal, or os._exit)"
        self.measurements["ending"] = ending

    def _steps(self) -> None:
        steps = self.log.steps
        if not steps:
            return
        peak = self.measurements.get("peak_bytes")
        memory = f", peak CUDA memory {size_text(peak)}" if peak else ""
        ending = self.measurements["ending"]
        self._check("steps", "info", f"{self.log.step_count} optimizer steps{memory}; ended: {ending}")

    def _numbers(self) -> dict[str, Any]:
        steps = self.log.steps
        peaks = [max((m["peak_bytes"] for m in s["memory"].values()), default=0) for s in steps]
        return {
            "pid": self.log.pid,
            "rank": self.log.rank,
            "argv": self.log.argv,
            "steps": self.log.step_count,
            "step_seconds_median": _median_step_seconds(steps),
            "peak_bytes_by_step": peaks[-_STEPS_KEPT:],
            "peak_bytes": max(peaks, default=None),
            "dense_kernels": self.observations.dense_events_total,
            "damaged_event_lines": self.log.damaged_lines,  # a process killed mid-write leaves one
        }


def _median_step_seconds(steps: list[StepEvent]) -> float | None:
    """Seconds per optimizer step, median over the gaps between step records (the first step, which
    compiles, is only their start; coalesced records count for the steps they span)."""
    marks = [(s["step"], s["t"]) for s in steps if math.isfinite(s["t"])]
    rates = [(t1 - t0) / (n1 - n0) for (n0, t0), (n1, t1) in itertools.pairwise(marks) if n1 > n0 and t1 >= t0]
    return round(statistics.median(rates), 6) if rates else None


def _worth_a_section(log: ProcessLog) -> bool:
    """A rank, or a process that trained, ran attention, broke a compiled graph, raised or ran out of
    memory; helpers that only imported torch (Inductor's compile workers) are listed in the run's
    measurements instead. A helper inherits RANK from its rank (Inductor's `python -c` that loads each
    compiled CPU kernel, ten in one small run), so a rank that never imported torch and exited as
    usual is a helper too."""
    obs = log.snapshot.observations if log.snapshot else RunSnapshot()
    script = obs.traced_script
    busy = bool(log.steps or log.dense or obs.autotuner_overlaps or obs.graph_breaks)
    busy = busy or (script is not None and bool(script["sites"] or script["flex_sites"]))
    helper = log.instrumented is None and log.exit is not None and log.exit["ending"] == "exit"
    return (log.rank is not None and not helper) or bool(busy or log.exceptions or log.ooms or log.agent_errors)


def _user_where(site: SourceSite | None, module: str | None) -> Where | None:
    """The user's line an event names, with the module that was running there."""
    return Where(file=site["file"], line=site["line"], function=site["function"], module=module) if site else None


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class RunJudge(Judge):
    def __init__(self, observations: RunObservations, budgets: Budgets) -> None:
        super().__init__("run", budgets)
        self.logs = observations.processes
        self.outcome = observations.outcome
        self.command = observations.command

    def judge(self) -> list[ProbeResult]:
        hang = self.outcome.hang
        stacks = hang["stacks"] if hang else {}
        shown = [log for log in self.logs if _worth_a_section(log) or log.pid in stacks]
        stopped = self.outcome.stopped_by_doctor
        deadline = hang.get("deadline_s") if hang else None
        sections = [ProcessJudge(log, stacks.get(log.pid), stopped, self.budgets, deadline).judge() for log in shown]
        self._overview(shown)
        overview = self.result()
        if self.outcome.interrupted:
            overview.status = "error"  # no verdict on a run that was cut short: exit 3
        overview.duration_s = self.outcome.duration_s
        return [overview, *sections]

    def _hung(self, hang: HangRecord) -> None:
        """The watchdog stopped the command: never a pass. Each process whose stacks were taken has
        its own `hang` finding; a command with none (not Python, or not instrumented) gets this one."""
        silent = hang["silent_s"]
        deadline = hang.get("deadline_s")
        if deadline is not None:
            summary = f"still running at its time limit of {deadline:g} s: stopped"
            self._check("watchdog", "fail", summary, "run-timeout")
            if not hang.get("stacks"):
                self.findings.append(
                    finding(
                        "run-timeout",
                        f"The command was still running at its time limit of {deadline:g} s; dflashdoctor stopped it",
                        detail="None of its processes had loaded the agent, so no stacks could be taken.",
                        evidence={"deadline_s": deadline, "command": self.command},
                        fix=_TIMEOUT_FIX,
                    )
                )
            return
        self._check("watchdog", "fail", f"no progress for {silent} s: stacks taken, run stopped", "hang")
        if hang.get("stacks"):
            return
        self.findings.append(
            finding(
                "hang",
                f"The command made no progress for {silent} s; dflashdoctor stopped it",
                detail="No instrumented Python process reported progress within --hang-timeout, so the run was "
                "stopped (SIGTERM to its process group, then SIGKILL). None of its processes had loaded the agent, "
                "so no stacks could be taken.",
                evidence={"silent_s": silent, "command": self.command, "returncode": self.outcome.returncode},
                fix="Raise --hang-timeout if the command was only slow (0 turns the watchdog off); run the Python "
                "program itself under `dflashdoctor run -- python ...` to get every thread's stack.",
            )
        )

    def _interrupted(self) -> None:
        """dflashdoctor itself was interrupted and stopped the command: the run did not end on its own,
        so there is no verdict on it (exit 3), only what was seen until then."""
        self._check("interrupted", "fail", "dflashdoctor was interrupted and stopped the run", "run-interrupted")
        self.findings.append(
            finding(
                "run-interrupted",
                "The run was stopped before it ended: dflashdoctor got Ctrl-C or SIGTERM",
                detail="The command was stopped (SIGINT to its process group, then SIGKILL). What each process did "
                "until then is in the sections below; what it would have done after is unknown.",
                evidence={"command": self.command, "returncode": self.outcome.returncode},
                fix="Run it again to the end (or with --steps N to stop it after N optimizer steps on purpose).",
            )
        )

    def _left_running(self, left: list[LeftRunningRecord]) -> None:
        self.findings.append(left_running_finding(left, "the command"))
        self._check(
            "leftovers", "fail", f"{len(left)} processes still ran after the command exited", "processes-left-running"
        )

    def _overview(self, shown: list[ProcessLog]) -> None:
        outcome = self.outcome
        code = outcome.returncode
        self.measurements.update(
            command=self.command,
            returncode=code,
            duration_s=outcome.duration_s,
            processes=[{"pid": log.pid, "rank": log.rank, "argv": log.argv} for log in self.logs],
            instrumented=len([log for log in self.logs if log.instrumented is not None]),
            progress_lines=outcome.progress_lines[-20:],
        )
        self._check(
            "processes",
            "pass" if shown else "warn",
            f"{len(self.logs)} Python processes started, {self.measurements['instrumented']} imported torch",
        )
        if not self.logs:
            self.findings.append(
                finding(
                    "instrumentation-unavailable",
                    "No Python process of the command loaded dflashdoctor's agent",
                    detail="The agent loads through PYTHONPATH: a command that is not Python, or Python run with "
                    "-I, -E or -S (which ignore it), is not instrumented.",
                    fix="Run the Python program itself under `dflashdoctor run -- python ...`.",
                )
            )
        if outcome.hang:
            self._hung(outcome.hang)
        if outcome.interrupted:
            self._interrupted()
        if outcome.left_running:
            self._left_running(outcome.left_running)
        if code == 0:
            self._check("exit code", "pass", "the command exited 0")
            return
        if outcome.stopped_by_doctor:
            self._check("exit code", "info", f"{code}: the run was stopped by dflashdoctor")
            return
        how = f"was killed by {_signal_name(code)}" if code is not None and code < 0 else f"exited with {code}"
        self._check("exit code", "fail", f"the command {how}", "child-failed")
        self.findings.append(
            finding(
                "child-failed",
                f"The command {how}",
                detail="Its exit code is kept as the run's; the sections per process say what each saw before.",
                evidence={"returncode": code, "command": self.command},
                fix="Read the uncaught exceptions and out-of-memory findings below, or the command's own output.",
            )
        )


def judge(observations: RunObservations, budgets: Budgets) -> list[ProbeResult]:
    return RunJudge(observations, budgets).judge()
