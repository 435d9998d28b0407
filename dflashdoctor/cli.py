"""The Typer app: one thin function per command; logic lives in dflashdoctor.commands."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, NoReturn, Protocol, cast

import typer

from dflashdoctor import __version__
from dflashdoctor.cli_options import (
    JsonOpt,
    PythonOpt,
    ReportDirOpt,
    SarifOpt,
    VerboseOpt,
    command_settings,
    path_given,
    probe_command,
    writable,
)
from dflashdoctor.commands.explain import ExplainOptions, explain, log_paths
from dflashdoctor.commands.init import InitOptions, init
from dflashdoctor.commands.lint import LintOptions, lint
from dflashdoctor.commands.merge import merge
from dflashdoctor.commands.show import show
from dflashdoctor.errors import BadInput
from dflashdoctor.gate.command import GateOptions, gate
from dflashdoctor.gate.hostfile import nodes_of
from dflashdoctor.lint import output as lint_output
from dflashdoctor.output import destination_problem, emit, stdout_conflict
from dflashdoctor.probe_spec import ReportRequest
from dflashdoctor.registry import PROBES
from dflashdoctor.report import EXIT_CRASH, EXIT_USAGE, Report
from dflashdoctor.report_folder import held
from dflashdoctor.safe_text import encodable, without_controls
from dflashdoctor.session import run_probe_command

_HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="dflashdoctor",
    help="Diagnose compiled-attention training pipelines: torch.compile, flex_attention, Triton, FLA.",
    no_args_is_help=True,
    context_settings=_HELP,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: `[tool.dflashdoctor]` is a TOML table, not markup
)

# Typer raises click's exceptions, from a vendored copy of click in newer releases: take the class
# from typer itself so both layouts are caught.
_CLICK_ERROR = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException" and issubclass(c, Exception)
)


class _ClickMessage(Protocol):
    """What is read of a ClickException (a class found at run time, so the checker is told)."""

    def format_message(self) -> str: ...


# The command line main() was given, as the user would retype it (`python -m` leaves a path in
# argv[0]): reports quote it. Set for the length of one main() call.
_COMMAND_LINE: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("command_line", default=None)


def _argv() -> list[str]:
    return list(_COMMAND_LINE.get() or ["dflashdoctor", *sys.argv[1:]])


def _reported(
    make: Callable[[], Report],
    report_dir: Path | None,
    json_output: bool,
    verbose: bool,
    *,
    junit: Path | None = None,
    sarif: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """A command's report made and put where it goes, its exit code returned: stdout claimed by one
    document at most, and the report folder the user named held by this command alone meanwhile
    (report_folder.held), both settled before anything runs."""
    stdout_conflict(json_output, junit=junit, sarif=sarif)
    with held(report_dir):
        return emit(
            make(),
            json_output=json_output,
            report_dir=report_dir,
            verbose=verbose,
            junit=junit,
            sarif=sarif,
            environ=environ,
        )


def _probe(name: str, options: object, json_output: bool, report_dir: Path | None, verbose: bool) -> None:
    """Run one command's probe (looked up in the registry), show or write its report, exit with its
    code; a probe that puts its report where it decides (run) is given what the command line asks."""
    spec = PROBES[name]
    if spec.own_output is not None:
        raise typer.Exit(spec.own_output(options, ReportRequest(json_output, report_dir, verbose, _argv())))
    raise typer.Exit(_reported(lambda: run_probe_command(spec, options, _argv()), report_dir, json_output, verbose))


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"dflashdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Exit codes: 0 no error findings, 1 error findings, 2 bad input, 3 a probe crashed or hung."""


# Every probe's command (each subcommand of one that has them) is made from its Options dataclass.
for _spec in PROBES.values():
    if _spec.subcommands:
        _group = typer.Typer(help=_spec.summary, no_args_is_help=True, context_settings=_HELP)
        app.add_typer(_group, name=_spec.name)
        for _subcommand in _spec.subcommands:
            _group.command(_subcommand)(probe_command(_spec, _probe, _subcommand))
    else:
        app.command(_spec.name, **command_settings(_spec))(probe_command(_spec, _probe))


@app.command("merge")
def merge_command(
    directory: Annotated[
        Path, typer.Argument(parser=path_given, help="The --report-dir every node of a run wrote its part in.")
    ],
    json_output: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """One report of a run on several nodes, from each node's part: per node, per rank. Runs nothing."""
    problem = destination_problem(directory) if directory.is_dir() else None  # the report goes into DIR
    if problem:
        raise BadInput(problem)
    report = merge(directory, _argv())
    raise typer.Exit(emit(report, json_output=json_output, report_dir=directory, verbose=verbose))


@app.command("gate")
def gate_command(
    config: Annotated[
        Path | None,
        typer.Option(
            parser=path_given, help="Gate configuration (TOML); default ./dflashdoctor.toml, else pyproject's table."
        ),
    ] = None,
    target: Annotated[str | None, typer.Option(help="Override the configured check-compile TARGET.")] = None,
    device: Annotated[str | None, typer.Option(help="Override the configured device: auto, cpu or cuda.")] = None,
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Also run this training command under `run` (split as a shell would), each process stopped "
            "after run_steps optimizer steps; overrides the configured `run`.",
        ),
    ] = None,
    script: Annotated[
        str | None,
        typer.Option(help="trace-attention traces this step script instead of the reference drafter."),
    ] = None,
    junit: Annotated[
        Path | None,
        typer.Option(
            callback=writable(folder=False), parser=path_given, help="Also write the JUnit XML here; - for stdout."
        ),
    ] = None,
    sarif: SarifOpt = None,
    python: PythonOpt = None,
    ssh: Annotated[
        list[str] | None,
        typer.Option(
            "--ssh",
            metavar="HOST",
            help="HOST, user@HOST or HOST:PORT: gate that machine over ssh; again for each node of a cluster.",
        ),
    ] = None,
    hostfile: Annotated[
        str | None,
        typer.Option(help="Gate every node of a `host slots=N` hostfile (DeepSpeed, MPI) at once; - reads stdin."),
    ] = None,
    trust: Annotated[
        list[Path] | None,
        typer.Option(
            "--trust",
            metavar="PATH",
            parser=path_given,
            help="Run the configuration's code from here (a file, or a folder and what is below it) although "
            "another user owns it or could change it; again for more paths.",
        ),
    ] = None,
    json_output: JsonOpt = False,
    report_dir: ReportDirOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run the probes that apply, against the configured budgets: one pass/fail step before a long run.
    `run`, `target` and `script` run code: a configuration, target or script that another local user
    owns or could change is refused unless --trust names it."""
    hosts = ssh or []
    nodes = nodes_of(hostfile, hosts) if hostfile is not None or len(hosts) > 1 else []
    options = GateOptions(
        config=config,
        cwd=Path.cwd(),
        target=target,
        device=device,
        run=run,
        script=script,
        python=python,
        ssh=hosts[0] if hosts and not nodes else None,
        nodes=nodes,
        trust=trust or [],
    )
    code = _reported(
        lambda: gate(options, _argv()), report_dir, json_output, verbose, junit=junit, sarif=sarif, environ=os.environ
    )
    raise typer.Exit(code)


@app.command("init")
def init_command(
    root: Annotated[
        Path, typer.Argument(parser=path_given, help="The repository's root; default the current folder.")
    ] = Path("."),
    write: Annotated[
        bool, typer.Option("--write", help="Add the table to ROOT/pyproject.toml (never over an existing one).")
    ] = False,
) -> None:
    """A commented [tool.dflashdoctor] for this repository, inferred from its source (nothing imported):
    the compiled flex_attention wrapper, the training command for `run`, threads. Then: dflashdoctor gate."""
    sys.stdout.write(init(InitOptions(root=root, write=write)))
    raise typer.Exit(0)


def _codes(value: str | None) -> list[str] | None:
    return None if value is None else [word for word in value.replace(" ", ",").split(",") if word]


@app.command("lint")
def lint_command(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(parser=path_given, help="Files or folders to scan; default the current folder."),
    ] = None,
    output_format: Annotated[
        str,
        typer.Option("--output-format", help="concise (one line a finding), full, json, github or sarif."),
    ] = "concise",
    select: Annotated[
        str | None, typer.Option(help="Only these codes (DFD001,DFD003; a prefix; ALL), over the config's.")
    ] = None,
    ignore: Annotated[str | None, typer.Option(help="Codes not reported, added to the config's.")] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(metavar="GLOB", help="A gitignore-style glob of files not read (again for more)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(parser=path_given, help="The pyproject.toml whose [tool.dflashdoctor.lint] is used."),
    ] = None,
    sarif: SarifOpt = None,
    json_output: JsonOpt = False,
    report_dir: ReportDirOpt = None,  # none is written unless asked for
) -> None:
    """The flex_attention patterns that make a long run dense, at file and line, as a linter: raw
    calls, wrappers compiled without Inductor or rebound, mask mods reading rebound globals, threads
    stepping models. Exit 0 clean, 1 findings, 2 usage. Reads source only."""
    if output_format not in lint_output.FORMATS:
        raise BadInput(f"--output-format must be one of {', '.join(lint_output.FORMATS)}, not {output_format!r}")
    options = LintOptions(
        paths=paths or [Path(".")],
        config=config,
        select=_codes(select),
        ignore=_codes(ignore) or [],
        exclude=exclude or [],
    )
    stdout_conflict(json_output, sarif=sarif)
    with held(report_dir):
        code = emit(
            lint(options, _argv()),
            json_output=json_output,
            report_dir=report_dir,
            verbose=False,
            sarif=sarif,
            text=lambda report: lint_output.render(report, output_format),
        )
    raise typer.Exit(code)


@app.command("explain")
def explain_command(
    logs: Annotated[
        list[Path] | None,
        typer.Argument(parser=path_given, help="The run's log files; - (or none) for stdin."),
    ] = None,
    from_run: Annotated[
        Path | None,
        typer.Option(
            "--from-run",
            parser=path_given,
            help="A `run` report folder (or its report.json): the tracebacks its processes recorded.",
        ),
    ] = None,
    sarif: SarifOpt = None,
    json_output: JsonOpt = False,
    report_dir: ReportDirOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """A crashed run's log diagnosed from its text: the failure class (flex dense, autotuner race,
    cache, recompile limit, kernel too large, graph break, FLA, transformers' flex path, or another
    cause), the user's frame, the ranks that failed, the command that confirms it and the fix."""
    if from_run is not None and logs:
        raise BadInput("explain reads either LOG files or --from-run DIR, not both")
    options = ExplainOptions(logs=log_paths(logs), from_run=from_run)
    code = _reported(lambda: explain(options, _argv()), report_dir, json_output, verbose, sarif=sarif)
    raise typer.Exit(code)


@app.command("show")
def show_command(
    report: Annotated[Path, typer.Argument(parser=path_given, help="A report.json that dflashdoctor wrote.")],
    format_name: Annotated[
        str, typer.Option("--format", help="terminal, json, md, html, sarif or junit.")
    ] = "terminal",
    verbose: VerboseOpt = False,
) -> None:
    """Render a saved report again, in any format, on stdout; runs nothing. Exit 0 once rendered (the
    report's own verdict is in what it prints), 2 for a file that is no report."""
    sys.stdout.write(show(report, format_name, verbose=verbose))
    raise typer.Exit(0)


class _Terminated(BaseException):
    """SIGTERM: a probe's process is stopped with the doctor, and `run` (which handles the signal itself
    while its command runs) writes its report. Not a KeyboardInterrupt, which click would swallow."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise _Terminated


# stdout that cannot take the report: full, a closed pipe or terminal, or not open at all
_OUTPUT_LOST = (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT, errno.EBADF)


class _Closed(io.TextIOBase):
    """Standing in for a standard stream the doctor was started without (`>&-`): Python gives None,
    which every print would turn into an AttributeError. Writing to it is EBADF, said as such."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")


def _usable_streams() -> None:
    """stdout and stderr as every output expects them: a closed one stands in as _Closed (stderr,
    where nothing can be said, as /dev/null), and one whose encoding cannot take a character (ASCII
    under LC_ALL=C without UTF-8 mode) shows it as an escape instead of raising."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the process's life
    if sys.stdout is None:
        sys.stdout = _Closed()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.encoding.lower().replace("-", "") != "utf8":
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


def _one_line(message: str) -> str:
    """A message as one line a terminal shows as text: it may quote the user's input (a file name, a
    key of a document), which can hold newlines, escape sequences or undecodable bytes."""
    return encodable(without_controls(message)).replace("\n", "\\n")


_STOP_GRACE_S = 5.0
_STOPPED = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def exit_process(code: int) -> NoReturn:
    """The console entry's end. Stopped (Ctrl-C, SIGTERM), the probes are stopped already; a thread
    of ours still blocked (a read that never returns) would keep the interpreter from exiting, as it
    joins its threads, so after a grace period the process ends without waiting for it."""
    if code in _STOPPED:
        deadline = time.monotonic() + _STOP_GRACE_S
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() and not t.daemon and t is not threading.current_thread() for t in threading.enumerate()):
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """`dflashdoctor ARGV` (sys.argv's when None), its exit code returned: bad input is one line and
    2; an internal error is one line and 3; interrupted outside a `run` (no report), 130 for Ctrl-C
    and 143 for SIGTERM. The SIGTERM handler it sets is put back on return."""
    args = list(sys.argv[1:] if argv is None else argv)
    # signals are the main thread's: called from another, SIGTERM stays with whoever set it
    main_thread = threading.current_thread() is threading.main_thread()
    previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    _usable_streams()
    token = _COMMAND_LINE.set(["dflashdoctor", *args])
    try:
        return _main(args)
    finally:
        _COMMAND_LINE.reset(token)
        if previous_sigterm is not None:  # None: set from C, where Python cannot put it back
            signal.signal(signal.SIGTERM, previous_sigterm)


def _main(args: list[str]) -> int:
    try:
        code = app(args=args, standalone_mode=False)
    except BadInput as exc:
        print(f"dflashdoctor: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except _CLICK_ERROR as exc:  # unknown option, missing value, bad number, ...
        print(f"dflashdoctor: {cast(_ClickMessage, exc).format_message()}", file=sys.stderr)
        return EXIT_USAGE
    except _Terminated:
        print("dflashdoctor: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    except (typer.Abort, KeyboardInterrupt):
        print("dflashdoctor: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except OSError as exc:
        if exc.errno not in _OUTPUT_LOST:
            print(f"dflashdoctor: internal error: {_one_line(f'{type(exc).__name__}: {exc}')}", file=sys.stderr)
            return EXIT_CRASH
        # stdout on a full disk or a closed pipe: the output cannot be written, say so in one line
        with contextlib.suppress(OSError):
            print(f"dflashdoctor: cannot write the output: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # typer's shell-completion options end the process themselves
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_CRASH)
    except Exception as exc:
        print(f"dflashdoctor: internal error: {_one_line(f'{type(exc).__name__}: {exc}')}", file=sys.stderr)
        return EXIT_CRASH
    return code if isinstance(code, int) else 0
