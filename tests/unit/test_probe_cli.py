"""The probe commands are made from their Options dataclasses (cli_options.probe_command): each
option a field declares is on the command line once, with its default, and what the user types
reaches the Options field it names. The commands run here on a recording runner, not a probe."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dflashdoctor.cli_options import command_settings, probe_command
from dflashdoctor.commands.cache import CacheOptions
from dflashdoctor.commands.check_compile import CheckCompileOptions
from dflashdoctor.commands.race import RaceOptions
from dflashdoctor.commands.run import RunOptions
from dflashdoctor.commands.trace_attention import TraceAttentionOptions
from dflashdoctor.registry import PROBES

GENERIC = [name for name, spec in PROBES.items() if not spec.subcommands]


def _parsed(name: str, *args: str, subcommand: str | None = None) -> tuple[object, tuple]:
    """The Options and report options the generated command (or subcommand) builds from `args`."""
    got: list = []
    app = typer.Typer()
    spec = PROBES[name]
    command = probe_command(spec, lambda *call: got.append(call), subcommand)
    app.command(subcommand or name, **command_settings(spec))(command)
    app.command("other")(lambda: None)  # two commands: the name is typed as a user types it
    result = CliRunner().invoke(app, [subcommand or name, *args])
    assert result.exit_code == 0, result.output
    (call,) = got
    return call[1], call[2:]


@pytest.mark.parametrize("name", GENERIC)
def test_defaults_on_the_command_line_are_the_options_defaults(name):
    options, (json_output, report_dir, verbose) = _parsed(name)
    assert options == PROBES[name].options()
    assert (json_output, report_dir, verbose) == (False, None, False)


def test_check_compile_collects_the_shape_and_takes_its_target():
    options, report = _parsed(
        "check-compile", "pkg.mod:fn", "--batch", "2", "--dtype", "float16", "--vary", "0", "--timeout", "5", "--json"
    )
    assert isinstance(options, CheckCompileOptions)
    assert (options.target, options.vary, options.timeout_s, report[0]) == ("pkg.mod:fn", 0, 5.0, True)
    assert options.shape == {"batch": 2, "dtype": "float16"}  # unset: the device's defaults


def test_trace_attention_takes_script_arguments_and_a_three_way_backward():
    options, _ = _parsed("trace-attention", "--script", "s.py", "--no-backward", "--", "--lr", "3")
    assert isinstance(options, TraceAttentionOptions)
    assert (options.script, options.script_args, options.backward) == ("s.py", ["--lr", "3"], False)
    options, _ = _parsed("trace-attention", "--backward")
    assert options.backward is True and options.script_args == []


def test_race_names_its_binaries_option_as_users_know_it(tmp_path):
    options, _ = _parsed("race", "--kernel", "fla", "--triton-binaries", str(tmp_path), "--ssh", "gpu1")
    assert isinstance(options, RaceOptions)
    assert (options.binaries_dir, options.ssh) == (Path(tmp_path), "gpu1")


def test_run_takes_the_command_after_the_dashes_with_its_own_options():
    options, report = _parsed(
        "run", "--steps", "3", "--hang-timeout", "0", "--json", "--", "torchrun", "--nproc", "2", "t.py", "--json"
    )
    assert isinstance(options, RunOptions)
    assert options.command == ["torchrun", "--nproc", "2", "t.py", "--json"]  # the program's, not ours
    assert (options.steps, options.hang_timeout_s, report[0]) == (3, 0.0, True)


@pytest.mark.parametrize(
    ("subcommand", "args", "wanted"),
    [
        ("check", ("--ssh", "gpu1", "--timeout", "5"), {"ssh": "gpu1", "timeout_s": 5.0}),
        ("fix", ("--wait", "0", "--all-roots"), {"wait_s": 0.0, "all_roots": True}),
        ("restore", ("q-folder", "--triton-dir", "t"), {"quarantine": Path("q-folder"), "triton_dir": Path("t")}),
    ],
)
def test_each_cache_subcommand_is_its_action_with_its_own_options(subcommand, args, wanted):
    options, _ = _parsed("cache", *args, subcommand=subcommand)
    assert isinstance(options, CacheOptions) and options.action == subcommand
    assert {name: getattr(options, name) for name in wanted} == wanted
    assert options == CacheOptions(subcommand, **wanted)  # everything else at its default


@pytest.mark.parametrize(("subcommand", "foreign"), [("check", "--wait"), ("fix", "--ssh"), ("restore", "--timeout")])
def test_a_cache_subcommand_refuses_another_ones_option(subcommand, foreign):
    app = typer.Typer()
    app.command(subcommand)(probe_command(PROBES["cache"], lambda *call: None, subcommand))
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, [subcommand, foreign, "1"])
    assert result.exit_code == 2 and "No such option" in result.output


@pytest.mark.parametrize("name", GENERIC)
def test_every_declared_option_is_on_the_command_line_once(name):
    command = typer.main.get_command_from_info(
        typer.models.CommandInfo(name=name, callback=probe_command(PROBES[name], lambda *call: None)),
        pretty_exceptions_short=True,
        rich_markup_mode=None,
    )
    flags = [flag for param in command.params for flag in param.opts]
    assert len(flags) == len(set(flags))
    for item in fields(PROBES[name].options):
        option = item.metadata.get("cli")
        if option is None or option.argument or option.command_line:
            continue
        if option.group:
            wanted = [f"--{member.replace('_', '-')}" for member, _kind, _help in option.group]
        else:
            wanted = [option.flag.split("/")[0] if option.flag else f"--{item.name.replace('_', '-')}"]
        assert set(wanted) <= set(flags), f"{name}: {item.name} is not on the command line as {wanted}"
