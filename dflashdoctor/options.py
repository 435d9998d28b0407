"""How a probe command's Options dataclass declares its command-line options, once: each field the
user sets carries `cli(...)` metadata (its help; its flag where the field's name is not it; whether
it is the positional argument), and `probe_cli` makes the Typer command from the fields. The
options every probe shares (`--python`, `--ssh`, `--timeout`, `--json`, `--report-dir`, `-v`) are
defined once, in probe_cli. No typer here: the command modules stay importable without the CLI.
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


def cli(help: str, *, flag: str | None = None, argument: bool = False, group: tuple = ()) -> dict[str, Any]:
    """A field's metadata: the option it is on the command line."""
    return {"cli": CliOption(help, flag, argument, group)}
