"""The command-line options every command shares, defined once, and each probe's command made from
its Options dataclass (options.cli metadata): adding a probe adds no Typer function, and an
option's default, type and help live in one place."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from dflashdoctor.limits import seconds_problem
from dflashdoctor.options import CliOption
from dflashdoctor.output import destination_problem
from dflashdoctor.probe_spec import ProbeSpec


def writable(*, folder: bool) -> Callable[[Path | None], Path | None]:
    """A typer callback: where a report goes (every command's --report-dir, or the default reports/;
    the gate's --junit and --sarif) is checked while the options are read, before any probe runs."""

    def check(value: Path | None) -> Path | None:
        problem = destination_problem(value, folder=folder) if value is not None or folder else None
        if problem:
            raise typer.BadParameter(problem)
        return value

    return check


def path_given(text: str) -> Path:
    """A Typer parser for every path option and argument: an empty one (an unset variable in a CI
    line, `--report-dir "$OUT"`) would be read as `.`, the current folder, and a report written
    over the files there; it is bad input instead."""
    if not text:
        raise typer.BadParameter("an empty path names nothing (an unset variable?)")
    return Path(text)


def _names_a_path(hint: Any) -> bool:
    return hint is Path or Path in typing.get_args(hint) or any(map(_names_a_path, typing.get_args(hint)))


def seconds(zero_means: str | None = None) -> Callable[[float], float]:
    """A typer callback: nan and infinity are refused (some releases of click let nan through `min`)."""

    def check(value: float) -> float:
        problem = seconds_problem(value, "", zero_means=zero_means)
        if problem:
            raise typer.BadParameter(problem)
        return value

    return check


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout, nothing else.")]
SarifOpt = Annotated[
    Path | None,
    typer.Option(
        callback=writable(folder=False), parser=path_given, help="Also write the SARIF 2.1.0 here; - for stdout."
    ),
]
ReportDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--report-dir",
        callback=writable(folder=True),
        parser=path_given,
        help="Write report.json/html/md, junit.xml and .sarif here.",
    ),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show each finding's evidence.")]
PythonOpt = Annotated[str | None, typer.Option("--python", help="Interpreter to probe with (default: this one).")]
SshOpt = Annotated[
    str | None,
    typer.Option("--ssh", help="[user@]host[:port]: run the probed side there through ssh (--python: its python)."),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=1, callback=seconds(), help="Seconds before a probe is killed.")
]

# An Options field of one of these names is the shared option: (its parameter, its annotation).
_SHARED_FIELDS = {"python": ("python", PythonOpt), "ssh": ("ssh", SshOpt), "timeout_s": ("timeout", TimeoutOpt)}
_REPORT_OPTIONS = (("json_output", JsonOpt, False), ("report_dir", ReportDirOpt, None), ("verbose", VerboseOpt, False))

ProbeRunner = Callable[[str, Any, bool, Path | None, bool], None]  # name, options, --json, --report-dir, -v


def probe_command(spec: ProbeSpec, run: ProbeRunner, subcommand: str | None = None) -> Callable[..., None]:
    """The Typer command of `spec` (of one of its subcommands, whose name its Options' `action` field
    takes): one parameter per Options field that has `cli` metadata (or is a shared one) and is not
    only in other subcommands, then --json, --report-dir and -v; calling it builds the Options and
    runs `run`."""
    hints = typing.get_type_hints(spec.options)
    parameters: list[inspect.Parameter] = []
    sources: dict[str, Callable[[dict[str, Any]], Any]] = {}  # an Options field -> its value from the parameters
    if subcommand is not None:
        sources["action"] = lambda _values: subcommand
    for item in fields(spec.options):
        option: CliOption | None = item.metadata.get("cli")
        if subcommand is not None and subcommand not in item.metadata.get("only_in", (subcommand,)):
            continue
        if item.name in _SHARED_FIELDS:
            name, annotation = _SHARED_FIELDS[item.name]
            parameters.append(_parameter(name, annotation, _default(item)))
            sources[item.name] = _named(name)
        elif option is not None and option.group:
            for member, kind, text in option.group:
                parameters.append(_parameter(member, Annotated[kind | None, typer.Option(help=text)], None))
            sources[item.name] = _collected([member for member, _kind, _text in option.group])
        elif option is not None and option.command_line:  # the words Typer leaves over: `ctx.args`
            parameters.insert(0, inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
            sources[item.name] = _left_over
        elif option is not None:
            default = _default(item)
            parameters.append(_parameter(item.name, _annotated(hints[item.name], option), _on_command_line(default)))
            sources[item.name] = _given(item.name, default)
    parameters += [_parameter(name, annotation, default) for name, annotation, default in _REPORT_OPTIONS]

    def command(**values: Any) -> None:
        options = spec.options(**{name: source(values) for name, source in sources.items()})
        run(spec.name, options, values["json_output"], values["report_dir"], values["verbose"])

    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__doc__ = spec.subcommands[subcommand] if subcommand is not None else spec.summary
    command.__name__ = f"{spec.name.replace('-', '_')}_{subcommand or 'command'}"
    return command


def command_settings(spec: ProbeSpec) -> dict[str, Any]:
    """How Typer registers `spec`'s command: one that runs another program's command line after `--`
    passes that program's options on, and its usage line says so."""
    line = next((o for item in fields(spec.options) if (o := item.metadata.get("cli")) and o.command_line), None)
    if line is None:
        return {}
    return {
        "context_settings": {
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "help_option_names": ["-h", "--help"],
        },
        "options_metavar": f"[OPTIONS] -- {line.help}",
    }


def _parameter(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


def _annotated(hint: Any, option: CliOption) -> Any:
    """The field's type as Typer reads it: a list argument may be left out (None)."""
    parser = path_given if _names_a_path(hint) else None  # None: Typer's own, by the type
    if option.argument:
        kind = hint | None if typing.get_origin(hint) is list else hint
        return Annotated[kind, typer.Argument(help=option.help, parser=parser)]
    flags = (option.flag,) if option.flag else ()
    if option.seconds is not None:
        return Annotated[hint, typer.Option(*flags, min=0, callback=seconds(option.seconds), help=option.help)]
    return Annotated[hint, typer.Option(*flags, help=option.help, parser=parser)]


def _default(item: Field[Any]) -> Any:
    if item.default is not MISSING:
        return item.default
    return item.default_factory() if item.default_factory is not MISSING else None


def _on_command_line(default: Any) -> Any:
    """A list left out is None on the command line (Typer's way), [] in the Options."""
    return None if default == [] else default


def _left_over(values: dict[str, Any]) -> list[str]:
    """The words after the options (another program's command line): Typer's context keeps them."""
    return list(values["ctx"].args)


def _named(parameter: str) -> Callable[[dict[str, Any]], Any]:
    return lambda values: values[parameter]


def _collected(members: list[str]) -> Callable[[dict[str, Any]], Any]:
    """A group's options as one dict, those left unset out of it (their defaults are elsewhere)."""
    return lambda values: {member: values[member] for member in members if values[member] is not None}


def _given(parameter: str, default: Any) -> Callable[[dict[str, Any]], Any]:
    """A list argument left out comes as None: the Options' default (an empty list) then."""
    return lambda values: default if values[parameter] is None and isinstance(default, list) else values[parameter]
