"""`init [PATH] [--write]`: a commented `[tool.dflashdoctor]` for a team's repository, inferred from
its source (lint/setup_facts.py, nothing imported): the compiled flex_attention wrapper the gate's
check-compile judges and every call must go through, the training command `run` runs for a few
steps (under torchrun where the program starts a process group), whether autotuned kernels run from
threads. Each line says what it was inferred from; `--write` adds the table to pyproject.toml, never
over one that is there."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dflashdoctor.errors import BadInput
from dflashdoctor.lint.setup_facts import Place, SetupFacts, python_setup, shell_setup
from dflashdoctor.lint.sources import SOURCE_BYTES, read_source, tree_files
from dflashdoctor.placed_files import read_placed


@dataclass
class InitOptions:
    root: Path = Path(".")
    write: bool = False


def _toml(value: object) -> str:
    return json.dumps(value)  # a JSON string or bool is the same TOML value


def _at(place: Place) -> str:
    return f"{place.file}:{place.line}"


_AUXILIARY = ("tests", "test", "benchmarks", "docs", "examples", "scripts")


def _ranked(places: list[Place]) -> list[Place]:
    """The team's own code first: a wrapper or trainer under tests/, benchmarks/, docs/ or examples/
    is a candidate only when nothing else is."""
    return sorted(places, key=lambda p: (Path(p.file).parts[0] in _AUXILIARY, len(Path(p.file).parts), p.file))


def scan(root: Path) -> SetupFacts:
    """Python files and shell scripts in one walk, each read once; what cannot be read or parsed
    says nothing (lint lists such files)."""
    facts = SetupFacts()
    for path, relative, python in tree_files(os.fspath(root)):
        try:
            data = read_source(path)
            if python:
                python_setup(facts, relative, data)
            else:
                shell_setup(facts, relative, data.decode("utf-8", errors="replace"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue
    return facts


def config_text(facts: SetupFacts) -> str:
    """The table, with a comment on each line saying what it came from."""
    lines = ["# dflashdoctor init: inferred from the source (nothing was imported or run); check each line.", ""]
    lines.append("[tool.dflashdoctor]")
    facts.wrappers, facts.trainers = _ranked(facts.wrappers), _ranked(facts.trainers)
    if facts.wrappers:
        wrapper = facts.wrappers[0]
        backend = facts.wrapper_backends.get(wrapper.what)
        said = f"torch.compile(flex_attention{f', backend={backend!r}' if backend else ''}) at {_at(wrapper)}"
        lines.append(f"target = {_toml(wrapper.what)}  # check-compile judges it: {said}")
        lines.append(
            f"# expect_wrapper = {_toml(wrapper.what)}  # with script = a file running one of your steps: "
            "trace-attention then checks that every flex_attention call goes through it"
        )
        for other in facts.wrappers[1:4]:
            lines.append(f"# another compiled flex_attention wrapper: {other.what} ({_at(other)})")
    else:
        lines.append("# target: no torch.compile(flex_attention) bound to a name was found; the reference's is judged")
    for hf in facts.hf_flex[:3]:
        lines.append(f"# {hf.what} at {_at(hf)}: transformers' flex path; `run` names each layer's calls")
    trainer = facts.trainers[0] if facts.trainers else None
    if trainer is not None:
        distributed = trainer.file in facts.distributed
        command = (
            f"torchrun --standalone --nproc-per-node 2 {trainer.file}" if distributed else f"python3 {trainer.file}"
        )
        why = "starts a process group: two ranks on this machine" if distributed else "steps an optimizer"
        lines.append(f"run = {_toml(command)}  # {_at(trainer)}: {trainer.what}, {why}")
        lines.append("run_steps = 3  # each process stops after this many optimizer steps")
    else:
        lines.append('# run: no entry point that steps an optimizer was found; set run = "python3 train.py ..."')
    for launcher in facts.launchers[:3]:
        lines.append(f"# a launch line at {_at(launcher)}: {launcher.what}")
    threaded = bool(facts.thread_pools)
    if threaded:
        first = facts.thread_pools[0]
        lines.append(f"threaded_autotuners = true  # {first.what} at {_at(first)}: kernels may be entered from threads")
    else:
        lines.append("threaded_autotuners = false  # no thread pool in a file that imports torch")
    return "\n".join(lines) + "\n"


def _write(pyproject: Path, text: str) -> None:
    """Add the table to pyproject.toml (made if missing); a file that has one keeps it."""
    if pyproject.is_symlink() or (pyproject.exists() and not pyproject.is_file()):
        raise BadInput(f"{pyproject} is not a regular file: not written")
    if pyproject.exists():
        try:
            existing = tomllib.loads(read_placed(pyproject, SOURCE_BYTES).decode("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise BadInput(f"{pyproject} cannot be read as TOML ({exc}): not written") from None
        if "dflashdoctor" in existing.get("tool", {}):
            raise BadInput(f"{pyproject} already has [tool.dflashdoctor]: not written over")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(pyproject, flags, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(("\n" if pyproject.stat().st_size else "") + text)


def init(options: InitOptions) -> str:
    if not options.root.is_dir():
        raise BadInput(f"{options.root} is not a folder")
    text = config_text(scan(options.root))
    if options.write:
        _write(options.root / "pyproject.toml", text)
        print(f"dflashdoctor init: added [tool.dflashdoctor] to {options.root / 'pyproject.toml'}", file=sys.stderr)
    return text
