"""`run -- CMD`: the user's own command under instrumentation, one report for all its processes.

On several nodes (torchrun's --nnodes, Slurm) each node's run is a part: `--report-dir` is the folder
all nodes share, each writes under its own `node<rank>-<host>` in it (runs/parts.py), and the node of
rank 0 waits for the others and merges the parts into one report there (commands/merge.py)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dflashdoctor.agent.config import RunSettings
from dflashdoctor.budgets import Budgets
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.run import judge
from dflashdoctor.limits import MAX_STEPS, count_problem
from dflashdoctor.options import cli
from dflashdoctor.output import emit, new_report_dir
from dflashdoctor.probe_spec import ProbeSpec, ReportRequest
from dflashdoctor.redaction import redact_argv
from dflashdoctor.render import write_report_dir
from dflashdoctor.report import Check, Report
from dflashdoctor.runs import launch
from dflashdoctor.runs.events import LogReader
from dflashdoctor.runs.observations import RunObservations
from dflashdoctor.runs.parts import NodePart, node_part, wait_for_parts, write_part
from dflashdoctor.runs.trace import trace_json
from dflashdoctor.runs.watch import Interrupts, watch
from dflashdoctor.safe_text import encodable_report
from dflashdoctor.session import finish, new_report, run_probe_command

_CLAIM = ".claimed-by-a-run"
_TRACE_NOTE = (
    "trace.json in the report folder: each process's steps, dense calls, OOM and hang on a timeline "
    "(open it in https://ui.perfetto.dev or chrome://tracing); for what happened inside each compile, "
    "run with TORCH_TRACE=<folder> and read that folder with tlparse"
)  # not *.jsonl: the event reader never takes it for a process's log


@dataclass
class RunOptions:
    command: list[str] = field(default_factory=list, metadata=cli("COMMAND ARGS...", command_line=True))
    report_dir: Path = Path("reports/run")
    hang_timeout_s: float | None = field(
        default=600.0,
        metadata=cli(
            "Seconds without progress in any process before the stacks are taken and the run is stopped; "
            "0 turns the watchdog off.",
            flag="--hang-timeout",
            seconds="turns the watchdog off",
        ),
    )
    steps: int | None = field(default=None, metadata=cli("Stop each process after this many optimizer steps."))
    memory_snapshot: bool = field(
        default=False,
        metadata=cli("Record CUDA allocations; on out-of-memory, dump a snapshot for PyTorch's viewer."),
    )
    strict: bool = field(
        default=False, metadata=cli("Make dynamo's recompile-limit fallback and dense flex_attention kernels raise.")
    )
    stdout_to_stderr: bool = False  # --json: the command's output must not mix with the report on stdout
    part: NodePart | None = None  # one node's part of a run on several (report_dir is then its folder)
    merge_wait_s: float = field(  # the node of rank 0: how long to wait for the other nodes' parts
        default=600.0,
        metadata=cli(
            "On several nodes, node 0: seconds to wait for the other nodes' parts before merging.",
            flag="--merge-wait",
            seconds="merges what is there",
        ),
    )
    deadline_s: float | None = None  # stopped after this long whatever its progress (the gate's run_timeout)
    temporary: bool = False  # the gate's: report_dir is removed once judged (by the launcher if the doctor dies)
    passes_interrupt: bool = False  # the gate's: SIGTERM or Ctrl-C stops the doctor (143, 130), no report


def report_folder(
    shared: Path | None, command: list[str], environ: Mapping[str, str]
) -> tuple[Path | None, NodePart | None]:
    """Where this run's report goes: the folder given, or on several nodes this node's part of it."""
    part = node_part(command, environ)
    if part is None:
        return shared, None
    if shared is None:
        raise BadInput(
            f"a run on {part.nnodes} nodes needs --report-dir: a folder every node shares, where each writes its part"
        )
    return shared / part.folder, part


def _claim(events: Path) -> None:
    """This run's own events folder: two runs started at once with one --report-dir would both find
    it empty and mix their processes into one report. The first to create the claim has it."""
    try:
        os.close(os.open(events / _CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        raise BadInput(f"{events} belongs to another run in the same folder: give another --report-dir") from None
    except OSError as exc:
        raise BadInput(f"cannot write into {events}: {exc.strerror}") from None


def run(options: RunOptions, argv: list[str], budgets: Budgets | None = None) -> Report:
    command = launch.resolve_command(options.command)
    if options.steps is not None and count_problem(options.steps, "--steps", 1, MAX_STEPS):
        raise BadInput(count_problem(options.steps, "--steps", 1, MAX_STEPS))
    if options.part is not None:
        write_part(options.report_dir, options.part, options.command)
    events = options.report_dir / "events"
    try:
        events.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create {events}: {exc.strerror}") from None
    if any(events.iterdir()):
        raise BadInput(f"{events} holds events of an earlier run: give another --report-dir")
    _claim(events)
    started = time.monotonic()
    report = new_report("run", argv)
    report.environment["target"] = " ".join(redact_argv(options.command))
    settings = RunSettings(steps=options.steps, memory_snapshot=options.memory_snapshot, strict=options.strict)
    reader = LogReader(events)
    # A SIGTERM from here until the watch ends stops the command and is reported (the watch gives the
    # doctor its own handlers back); the launcher removes the temporary folders as its block ends, or
    # once the doctor is gone.
    with Interrupts() as interrupts:
        bootstrap = launch.bootstrap_folder()
        temporary = [bootstrap, *([options.report_dir] if options.temporary else [])]
        environment = launch.child_environment(bootstrap, events, settings)
        with launch.start(command, environment, temporary, stdout_to_stderr=options.stdout_to_stderr) as child:
            outcome = watch(
                child,
                reader,
                interrupts,
                options.hang_timeout_s,
                options.deadline_s,
                passes_interrupt=options.passes_interrupt,
            )
            processes = reader.update(final=True)  # the lines written since the watch last read
            observations = RunObservations(command=redact_argv(options.command), outcome=outcome, processes=processes)
            report.observations["run"] = observations.to_dict()
            report.results.extend(judge(observations, budgets or Budgets()))
            report.files["trace.json"] = trace_json(observations)
            report.results[0].checks.append(Check("trace", "info", _TRACE_NOTE))
    instrumented = next((log.instrumented for log in observations.processes if log.instrumented), None)
    if instrumented:
        report.environment["torch"] = instrumented.get("torch")
    return finish(report, started)


def merge_when_first(options: RunOptions, code: int, argv: list[str]) -> int:
    """On the node of rank 0 of several: once the other nodes' parts are in (or the wait is over),
    the merged report goes beside them, and the worse of the two exit codes is this run's."""
    from dflashdoctor.commands.merge import merge

    part = options.part
    if part is None or part.node_rank != 0:
        return code
    shared = options.report_dir.parent
    print(
        f"dflashdoctor run: waiting up to {options.merge_wait_s:g} s for {part.nnodes - 1} other nodes", file=sys.stderr
    )
    parts = wait_for_parts(shared, part.nnodes, options.merge_wait_s)
    merged = merge(shared, argv, parts)
    write_report_dir(encodable_report(merged), shared, merged.observations_json())
    finished = sum(1 for p in parts if p.report is not None)
    print(
        f"dflashdoctor run: {finished} of {part.nnodes} nodes merged, {merged.verdict.upper()}: {shared}/report.html",
        file=sys.stderr,
    )
    return max(code, merged.exit_code())


def run_and_report(options: RunOptions, asked: ReportRequest) -> int:
    """The run from the command line: the command only after `--` (else its own options, --steps or
    --json, would be taken as ours), its report in the folder given (on several nodes, this node's
    part of it) or a new one, and on the node of rank 0 of several the merged report too."""
    if "--" not in asked.argv:
        raise BadInput("put the command after --, e.g. dflashdoctor run -- python train.py")
    folder, part = report_folder(asked.report_dir, options.command, os.environ)
    directory = folder or new_report_dir("run")
    options = replace(
        options,
        report_dir=directory,
        hang_timeout_s=options.hang_timeout_s or None,  # 0: no watchdog
        stdout_to_stderr=asked.json_output,
        part=part,
    )
    report = run_probe_command(SPEC, options, asked.argv)
    code = emit(report, json_output=asked.json_output, report_dir=directory, verbose=asked.verbose)
    return merge_when_first(options, code, asked.argv)


SPEC = ProbeSpec(
    name="run",
    options=RunOptions,
    observations=RunObservations,
    judge=judge,
    command=run,
    script=None,  # the user's own command, with the agent (agent/) loaded into each of its processes
    summary="Run COMMAND (python ..., python -m ..., torchrun ...) with every Python process instrumented: the "
    "command goes after `--`.",
    own_output=run_and_report,
)
