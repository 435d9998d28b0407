"""`init [PATH] [--write]`: a commented `[tool.dflashdoctor]` for a team's repository, inferred from
its source (lint/setup_facts.py, nothing imported): the compiled flex_attention wrapper the gate's
check-compile judges and every call must go through, the training command `run` runs for a few
steps (under torchrun where the program starts a process group), whether autotuned kernels run from
threads. Each line says what it was inferred from; `--write` adds the table to pyproject.toml, never
over one that is there (pyproject_table.py).

The folder is opened once and everything after goes through that descriptor: a scan takes seconds
on a large tree, and a folder swapped for a link meanwhile must not make `--write` add the table to
another project. Strings from the repository (file names, launch lines) are written by toml_text,
so none can become a key."""

from __future__ import annotations

import errno
import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashdoctor import toml_text
from dflashdoctor.errors import BadInput
from dflashdoctor.lint.choice import choose_run, choose_target, choose_trainer, place_penalty
from dflashdoctor.lint.launches import Launch, launches, project_scripts
from dflashdoctor.lint.setup_facts import Place, SetupFacts, document_setup, python_setup
from dflashdoctor.lint.sources import read_source, tree_files
from dflashdoctor.pyproject_table import add_table
from dflashdoctor.redaction import redact_argv
from dflashdoctor.safe_paths import PathRefused, open_folder

_NPROC = re.compile(r"^--nproc[-_]per[-_]node(=\d+)?$")
HEADER = "# dflashdoctor init: inferred from the source (nothing was imported or run); check each line."


@dataclass
class InitOptions:
    root: Path = Path(".")
    write: bool = False


def _at(place: Place) -> str:
    return f"{place.file}:{place.line}"


def scan(root_fd: int) -> tuple[SetupFacts, set[str]]:
    """Python files and documents in one walk below the open folder, each read once; what cannot
    be read or parsed says nothing (lint lists such files). Also every file's path, which says
    whether a documented program or config file is there."""
    facts, files = SetupFacts(), set()
    for folder_fd, name, relative, python in tree_files(root_fd):
        files.add(relative)
        try:
            data = read_source(name, dir_fd=folder_fd)
            if python:
                python_setup(facts, relative, data)
            else:
                document_setup(facts, relative, data.decode("utf-8", errors="replace"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue
    return facts, files


@dataclass
class Entry:
    """One line of the table: a key with its value and what it was inferred from, or (`key` None) a
    comment alone."""

    key: str | None
    value: object = None
    note: str = ""


def _entry_file(launch: Launch | None, trainer: Place | None) -> str | None:
    if launch is not None:
        return launch.entry[3:].replace(".", "/") + ".py" if launch.entry.startswith("-m ") else launch.entry
    return trainer.file if trainer is not None else None


def _wrapper_entries(facts: SetupFacts, entry_file: str | None) -> list[Entry]:
    wrapper, how = choose_target(facts, entry_file.removeprefix("./") if entry_file else None)
    if wrapper is None:
        return [
            Entry(
                None,
                note="target: no compiled flex_attention wrapper in the team's code (tests, benchmarks, examples "
                "and old records are not used); the reference's is judged",
            )
        ]
    said = f"{facts.wrapper_how.get(wrapper.what, _at(wrapper))}, {how}"
    expect = (
        f"expect_wrapper = {wrapper.what}: with script = a file running one of your steps, "
        "trace-attention then checks that every flex_attention call goes through it"
    )
    others = [
        Entry(None, note=f"another compiled flex_attention wrapper: {o.what} ({_at(o)})")
        for o in facts.wrappers
        if o is not wrapper and place_penalty(o.file) < 100
    ][:3]
    return [Entry("target", wrapper.what, f"check-compile judges it: {said}"), Entry(None, note=expect), *others]


def _script_word(relative: str) -> str:
    """A file's path as one word of the `run` line, which the gate splits as a shell would: quoted
    (`my train.py`), and never read as an option (`-c...py` would have run the code in its name)."""
    return shlex.quote(f"./{relative}" if relative.startswith("-") else relative)


def _launch_entries(launch: Launch, choice_why: str, sure: str) -> list[Entry]:
    command = " ".join(redact_argv(launch.words))
    unset = sorted({word for word in launch.words if "$" in word})
    if unset:
        return [
            Entry(
                None,
                note=f"run = {command!r}: {choice_why}; set {', '.join(unset)} first (nothing in the "
                "repository sets it), then uncomment",
            ),
        ]
    ranks = [int(w.rsplit("=", 1)[-1]) for w in launch.words if _NPROC.match(w) and "=" in w]
    ranks += [int(n) for w, n in zip(launch.words, launch.words[1:], strict=False) if _NPROC.match(w) and n.isdigit()]
    scale = f"; {ranks[0]} processes as documented: lower it to this node's GPUs" if ranks and ranks[0] > 2 else ""
    return [
        Entry("run", command, f"{choice_why} ({sure}){scale}"),
        Entry("run_steps", 3, "each process stops after this many optimizer steps"),
    ]


def _run_entries(facts: SetupFacts, launch: Launch | None, trainer: Place | None, why: str, sure: str) -> list[Entry]:
    if launch is not None:
        return _launch_entries(launch, why, sure)
    if trainer is None:
        return [
            Entry(
                None,
                note="run: no documented training command and no entry point that steps an optimizer; "
                'set run = "python3 train.py --config ..."',
            )
        ]
    distributed = trainer.file in facts.distributed
    script = _script_word(trainer.file)
    command = f"torchrun --standalone --nproc-per-node 2 {script}" if distributed else f"python3 {script}"
    reason = "starts a process group: two ranks on this machine" if distributed else "steps an optimizer"
    return [
        Entry(
            "run",
            command,
            f"{_at(trainer)}: an entry point that {reason}; no document launches it, so add the "
            "arguments it needs (guessed)",
        ),
        Entry("run_steps", 3, "each process stops after this many optimizer steps"),
    ]


def entries(facts: SetupFacts, files: set[str]) -> list[Entry]:
    """The table, each key with what it came from."""
    scripts = project_scripts(facts.documents.get("pyproject.toml", ""))
    found = launches(facts.documents, scripts)
    launch, run_choice = choose_run(facts, found, files)
    trainer = None if launch is not None else choose_trainer(facts)
    table = _wrapper_entries(facts, _entry_file(launch, trainer))
    table += [
        Entry(None, note=f"{hf.what} at {_at(hf)}: transformers' flex path; `run` names each layer's calls")
        for hf in facts.hf_flex[:3]
    ]
    table += _run_entries(
        facts, launch, trainer, run_choice.why if run_choice else "", run_choice.sure if run_choice else ""
    )
    threaded = [t for t in facts.threaded if place_penalty(t.file) < 6]
    if threaded:
        first = threaded[0]
        table.append(Entry("threaded_autotuners", True, f"{_at(first)}: {first.what}"))
    else:
        table.append(Entry("threaded_autotuners", False, "no thread in the team's code runs a model or kernel step"))
    return table


def _line(entry: Entry) -> str:
    """A key and its comment; a value TOML cannot hold (a file name that is not UTF-8) is a comment
    saying so instead of a key."""
    if entry.key is None:
        return toml_text.comment(entry.note)
    try:
        return f"{entry.key} = {toml_text.value(entry.value)}  {toml_text.comment(entry.note)}"
    except toml_text.NotText as exc:
        return toml_text.comment(f"{entry.key}: {exc}, which TOML cannot hold; {entry.note}")


def config_text(table: list[Entry]) -> str:
    """The table as TOML, with a comment on each line saying what it came from."""
    return "\n".join([HEADER, "", "[tool.dflashdoctor]", *map(_line, table)]) + "\n"


def _open_root(root: Path) -> int:
    """The repository's folder, opened once (a link on the way only when this user or root made it)."""
    try:
        return open_folder(root)
    except PathRefused as exc:
        raise BadInput(f"{exc}: not scanned") from None
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise BadInput(f"{root} is not a folder") from None
        raise BadInput(f"cannot open {root}: {exc.strerror or exc}") from None


def init(options: InitOptions) -> str:
    root_fd = _open_root(options.root)
    try:
        try:
            text = config_text(entries(*scan(root_fd)))
        except (OSError, RecursionError) as exc:  # a tree nested deeper than descriptors or the stack allow
            raise BadInput(f"cannot walk {options.root}: {getattr(exc, 'strerror', None) or exc}") from None
        if options.write:
            table: dict[str, Any] = tomllib.loads(text)["tool"]["dflashdoctor"]
            add_table(root_fd, options.root / "pyproject.toml", text, table)
            print(f"dflashdoctor init: added [tool.dflashdoctor] to {options.root / 'pyproject.toml'}", file=sys.stderr)
    finally:
        os.close(root_fd)
    return text
