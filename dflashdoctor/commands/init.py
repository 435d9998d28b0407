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
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashdoctor import toml_text
from dflashdoctor.errors import BadInput
from dflashdoctor.lint.setup_facts import Place, SetupFacts, python_setup, shell_setup
from dflashdoctor.lint.sources import read_source, tree_files
from dflashdoctor.pyproject_table import add_table
from dflashdoctor.redaction import redact_argv
from dflashdoctor.safe_paths import PathRefused, open_folder

HEADER = "# dflashdoctor init: inferred from the source (nothing was imported or run); check each line."


@dataclass
class InitOptions:
    root: Path = Path(".")
    write: bool = False


def _at(place: Place) -> str:
    return f"{place.file}:{place.line}"


_AUXILIARY = ("tests", "test", "benchmarks", "docs", "examples", "scripts")


def _ranked(places: list[Place]) -> list[Place]:
    """The team's own code first: a wrapper or trainer under tests/, benchmarks/, docs/ or examples/
    is a candidate only when nothing else is."""
    return sorted(places, key=lambda p: (Path(p.file).parts[0] in _AUXILIARY, len(Path(p.file).parts), p.file))


def scan(root_fd: int) -> SetupFacts:
    """Python files and shell scripts in one walk below the open folder, each read once; what cannot
    be read or parsed says nothing (lint lists such files)."""
    facts = SetupFacts()
    for folder_fd, name, relative, python in tree_files(root_fd):
        try:
            data = read_source(name, dir_fd=folder_fd)
            if python:
                python_setup(facts, relative, data)
            else:
                shell_setup(facts, relative, data.decode("utf-8", errors="replace"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue
    return facts


@dataclass
class Entry:
    """One line of the table: a key with its value and what it was inferred from, or (`key` None) a
    comment alone."""

    key: str | None
    value: object = None
    note: str = ""


def _wrapper_entries(facts: SetupFacts) -> list[Entry]:
    if not facts.wrappers:
        return [Entry(None, note="target: no torch.compile(flex_attention) bound to a name; the reference's is judged")]
    wrapper = facts.wrappers[0]
    backend = facts.wrapper_backends.get(wrapper.what)
    said = f"torch.compile(flex_attention{f', backend={backend!r}' if backend else ''}) at {_at(wrapper)}"
    expect = (
        f"expect_wrapper = {wrapper.what}: with script = a file running one of your steps, "
        "trace-attention then checks that every flex_attention call goes through it"
    )
    others = [
        Entry(None, note=f"another compiled flex_attention wrapper: {o.what} ({_at(o)})") for o in facts.wrappers[1:4]
    ]
    return [Entry("target", wrapper.what, f"check-compile judges it: {said}"), Entry(None, note=expect), *others]


def _script_word(relative: str) -> str:
    """A file's path as one word of the `run` line, which the gate splits as a shell would: quoted
    (`my train.py`), and never read as an option (`-c...py` would have run the code in its name)."""
    return shlex.quote(f"./{relative}" if relative.startswith("-") else relative)


def _run_entries(facts: SetupFacts) -> list[Entry]:
    trainer = facts.trainers[0] if facts.trainers else None
    if trainer is None:
        return [
            Entry(None, note='run: no entry point that steps an optimizer was found; set run = "python3 train.py ..."')
        ]
    distributed = trainer.file in facts.distributed
    script = _script_word(trainer.file)
    command = f"torchrun --standalone --nproc-per-node 2 {script}" if distributed else f"python3 {script}"
    why = "starts a process group: two ranks on this machine" if distributed else "steps an optimizer"
    return [
        Entry("run", command, f"{_at(trainer)}: {trainer.what}, {why}"),
        Entry("run_steps", 3, "each process stops after this many optimizer steps"),
    ]


def entries(facts: SetupFacts) -> list[Entry]:
    """The table, each key with what it came from."""
    facts.wrappers, facts.trainers = _ranked(facts.wrappers), _ranked(facts.trainers)
    table = _wrapper_entries(facts)
    table += [
        Entry(None, note=f"{hf.what} at {_at(hf)}: transformers' flex path; `run` names each layer's calls")
        for hf in facts.hf_flex[:3]
    ]
    table += _run_entries(facts)
    table += [
        Entry(None, note=f"a launch line at {_at(launcher)}: {' '.join(redact_argv(launcher.what.split(' ')))}")
        for launcher in facts.launchers[:3]
    ]
    if facts.thread_pools:
        first = facts.thread_pools[0]
        note = f"{first.what} at {_at(first)}: kernels may be entered from threads"
        table.append(Entry("threaded_autotuners", True, note))
    else:
        table.append(Entry("threaded_autotuners", False, "no thread pool in a file that imports torch"))
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
            text = config_text(entries(scan(root_fd)))
        except (OSError, RecursionError) as exc:  # a tree nested deeper than descriptors or the stack allow
            raise BadInput(f"cannot walk {options.root}: {getattr(exc, 'strerror', None) or exc}") from None
        if options.write:
            table: dict[str, Any] = tomllib.loads(text)["tool"]["dflashdoctor"]
            add_table(root_fd, options.root / "pyproject.toml", text, table)
            print(f"dflashdoctor init: added [tool.dflashdoctor] to {options.root / 'pyproject.toml'}", file=sys.stderr)
    finally:
        os.close(root_fd)
    return text
