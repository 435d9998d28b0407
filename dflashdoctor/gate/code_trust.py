"""The code a gate's configuration makes it run, checked before anything runs (trust.py): the target's
file (and the packages above it when it is a module found in the current folder), the script, the
folders either puts on the import path, the folder the `run` command starts in and the code its line
names."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from dflashdoctor.gate.config import GateConfig
from dflashdoctor.gate.run_smoke import run_command
from dflashdoctor.trust import Trust


def _module_files(cwd: Path, dotted: str, whose: str) -> Iterator[tuple[Path, str]]:
    """The files and package folders a module name would be imported from, where it is found in the
    current folder (first on a probe's path); none when it is not there (an installed package: the
    environment's, not a file someone put here). Found by name only: nothing is imported."""
    folder = cwd
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        package, module = folder / part, folder / f"{part}.py"
        if package.is_dir():
            yield package, f"a package folder of {whose}"
            if (package / "__init__.py").is_file():
                yield package / "__init__.py", f"a package of {whose}"
            if depth == len(parts) - 1:
                return
            folder = package
        elif module.is_file():
            yield module, f"the module of {whose}"
            return
        else:
            return


def _module_problems(cwd: Path, dotted: str, trust: Trust, whose: str) -> Iterator[str | None]:
    for path, role in _module_files(cwd, dotted, whose):
        yield trust.import_folder_problem(path, role) if path.is_dir() else trust.file_problem(path, role)


def _problems(config: GateConfig, trust: Trust, cwd: Path) -> Iterator[str | None]:
    module_part = config.check_compile.target.rpartition(":")[0]
    if module_part.endswith(".py") or os.sep in module_part:
        target = Path(module_part)
        yield trust.file_problem(target, "the target's file")
        yield trust.import_folder_problem(target.parent, "the target's folder (put on the import path)")
    elif any(_module_files(cwd, module_part, "the target")):  # found in the current folder, first on a probe's path
        yield trust.import_folder_problem(cwd, "the current folder, where the target's module is")
        yield from _module_problems(cwd, module_part, trust, "the target")
    if config.trace_attention.script is not None:
        script = Path(config.trace_attention.script)
        yield trust.file_problem(script, "the script")
        yield trust.import_folder_problem(script.parent, "the script's folder (put on the import path)")
    if config.run is not None:
        yield trust.import_folder_problem(cwd, "the folder the `run` command starts in")
        yield from _run_problems(run_command(config.run), trust, cwd)


_CODE_SUFFIXES = (".py", ".sh", ".bash", ".zsh", ".pyz")


def _run_problems(words: list[str], trust: Trust, cwd: Path) -> Iterator[str | None]:
    """The code a `run` line names: its program where given as a path (`./train.sh`), every script
    or executable file among its words (`python3 train.py`, `--launcher=tools/run.sh`) with the
    folder Python puts first on the path for a script, and a module run with `-m` from the current
    folder. A data file the line names (a dataset, a YAML) is not code and is not judged."""
    for index, word in enumerate(words):
        if index > 0 and words[index - 1] == "-m":
            yield from _module_problems(cwd, word, trust, "what `run` runs with -m")
            continue
        if word.startswith("-m") and len(word) > 2:  # `python -mpkg.train`
            yield from _module_problems(cwd, word[2:], trust, "what `run` runs with -m")
            continue
        for candidate in {word, word.partition("=")[2]} - {""}:
            path = Path(candidate)
            named_as_program = index == 0 and "/" in candidate
            try:
                code = path.is_file() and (
                    named_as_program or candidate.endswith(_CODE_SUFFIXES) or os.access(path, os.X_OK)
                )
            except (OSError, ValueError):  # a word too long or holding a NUL is no file
                continue
            if code and (index > 0 or named_as_program):
                yield trust.file_problem(path, "a file the `run` command runs")
                if candidate.endswith(".py"):
                    yield trust.import_folder_problem(path.parent, "the folder of a script `run` runs (on its path)")


def code_problem(config: GateConfig, trust: Trust, cwd: Path) -> str | None:
    """The first reason not to run what the configuration names here, in one line; None if none."""
    return next((problem for problem in _problems(config, trust, cwd) if problem), None)
