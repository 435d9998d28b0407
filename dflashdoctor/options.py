"""How a probe command's Options dataclass declares its command-line options, once: each field the
user sets carries `cli(...)` metadata (its help; its flag where the field's name is not it; whether
it is the positional argument, or the words of another command after `--`; a duration's meaning of
0), and `cli_options.probe_command` makes the Typer command from the fields. A probe with
subcommands (cache's check, fix, restore) names them on its ProbeSpec, and a field only some of them
take says which with `only_in(...)`. The options every probe shares (`--python`, `--ssh`,
`--timeout`, `--json`, `--report-dir`, `-v`) are defined once, in cli_options. No typer here: the
command modules stay importable without the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CliOption:
    help: str
    flag: str | None = None  # "--triton-binaries", "--backward/--no-backward"; None: from the field's name
    argument: bool = False  # the command's positional argument
    # A dict field set by several options, each (name, type, help): check-compile's shape
    group: tuple[tuple[str, type, str], ...] = ()
    # The words after `--` are another program's command line (run's COMMAND ARGS...): options it does
    # not know are that program's, and `help` is how the usage line names it.
    command_line: bool = False
    # A duration in seconds: 0 or more, never nan or infinity; what 0 means, said when it is refused.
    seconds: str | None = None


def cli(
    help: str,
    *,
    flag: str | None = None,
    argument: bool = False,
    group: tuple[tuple[str, type, str], ...] = (),
    command_line: bool = False,
    seconds: str | None = None,
) -> dict[str, Any]:
    """A field's metadata: the option it is on the command line."""
    return {"cli": CliOption(help, flag, argument, group, command_line, seconds)}


def only_in(*subcommands: str) -> dict[str, Any]:
    """A field's metadata: the subcommands whose command line has it (the others leave its default)."""
    return {"only_in": subcommands}
