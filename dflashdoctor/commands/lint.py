"""`lint [PATH...]`: the flex_attention patterns that make a long run dense or racy, found in the
source (lint/) and printed as a linter prints them: one line a finding by default, exit 0 when
nothing is reported, 1 when something is, 2 for bad usage, as ruff does; `# noqa` and the
`[tool.dflashdoctor.lint]` table choose what is reported. No report folder is written unless
`--report-dir` asks for one. Nothing is imported and torch need not be installed.

Two passes: every file is first read for what it compiles (a model compiled whole in the launcher
makes the calls inside it compiled, lint/project.py), then each file that names flex_attention is
judged against all of it."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.util import decode_source
from pathlib import Path

from dflashdoctor.errors import BadInput
from dflashdoctor.lint import sources
from dflashdoctor.lint.facts import FileFacts, file_facts, thread_facts
from dflashdoctor.lint.noqa import directives, silenced
from dflashdoctor.lint.project import Project, compiles_something, marked_root, project_root
from dflashdoctor.lint.rules import judge_file
from dflashdoctor.lint.settings import LintSettings, load
from dflashdoctor.lint.threads import may_thread_a_step
from dflashdoctor.lint.walk import lint_files
from dflashdoctor.placed_files import kind_of
from dflashdoctor.report import Check, Finding, ProbeResult, Report
from dflashdoctor.session import finish, new_report

_NEEDLE = b"flex_attention"


@dataclass
class LintOptions:
    paths: list[Path] = field(default_factory=lambda: [Path(".")])
    config: Path | None = None
    select: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)


def python_files(paths: list[Path]) -> Iterator[Path]:
    """Every .py file lint reads below the paths with the default settings (what a benchmark's floor
    reads)."""
    for path in paths:
        base = path.resolve() if path.is_dir() else path.resolve().parent
        yield from (Path(found) for found, _relative in lint_files([path], LintSettings(), base))


def _scannable(path: Path) -> None:
    """A path given is a regular file or a folder (through a link), else bad input in one line. One
    stat, every error of it said: Path.exists() raised what it does not take as "not there" (a name
    too long, ENAMETOOLONG), which ended as an internal error."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise BadInput(f"no such file or folder: {path}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise BadInput(f"{path} is {kind_of(mode)}, not a file or folder of source")


@dataclass
class _Read:
    """What the first pass keeps of each file: facts to judge, `# noqa` lines, what was unreadable."""

    judged: list[tuple[FileFacts, dict[int, frozenset[str] | None]]] = field(default_factory=list)
    project: Project = field(default_factory=Project)
    unreadable: list[str] = field(default_factory=list)
    scanned: int = 0


def _read_file(read: _Read, path: str, relative: str) -> None:
    try:
        data = sources.read_source(path)
    except OSError:
        read.unreadable.append(path)
        return
    read.scanned += 1
    flex = _NEEDLE in data
    threads = not flex and may_thread_a_step(data)
    if not (flex or threads or compiles_something(data)):
        return  # no rule can fire on it, and it compiles nothing: read, not parsed
    try:
        facts = thread_facts(path, data) if threads else file_facts(path, data, follow=flex)
        noqa = directives(decode_source(data)) if flex or threads else {}
    except (SyntaxError, ValueError, RecursionError, UnicodeError, LookupError):
        read.unreadable.append(path)
        return
    facts.relative = relative
    read.project.add(facts)
    if flex or threads:
        read.judged.append((facts, noqa))


def _context_files(paths: list[Path], settings: LintSettings) -> list[str]:
    """The rest of the project of each file named alone: its marked project's files; a file in no
    project (`lint /tmp/x.py`) has only the files beside it, never a walk of all of /tmp."""
    found: list[str] = []
    for path in paths:
        if path.is_dir():
            continue
        root = marked_root(path)
        if root is not None:
            found += [name for name, _relative in lint_files([root], settings, root)]
        else:
            folder = path.resolve().parent
            found += sorted(str(f) for f in folder.glob("*.py") if f.is_file() and not f.is_symlink())
    return list(dict.fromkeys(found))


def _context(read: _Read, paths: list[Path], settings: LintSettings, seen: set[str]) -> None:
    """For files named alone (a pre-commit hook's): what the rest of their project compiles."""
    judged = {os.path.realpath(path) for path in seen}
    for path in _context_files(paths, settings):
        if os.path.realpath(path) in judged:
            continue
        try:
            data = sources.read_source(path)
            if compiles_something(data):
                read.project.add(file_facts(path, data, follow=False))
        except (OSError, SyntaxError, ValueError, RecursionError):
            continue


def _base(options: LintOptions, settings: LintSettings) -> Path:
    """The folder paths are relative to for `exclude`, `per-file-ignores` and the test rule: the
    configuration's, else the project of the first path."""
    if settings.source is not None:
        return Path(settings.source).resolve().parent
    first = options.paths[0].resolve()
    return project_root(first / "x") if first.is_dir() else project_root(first)


def lint(options: LintOptions, argv: list[str]) -> Report:
    for path in options.paths:
        _scannable(path)
    started = time.monotonic()
    start = options.paths[0] if options.paths[0].is_dir() else options.paths[0].parent
    settings = load(options.config, start, select=options.select, ignore=options.ignore, exclude=options.exclude)
    base = _base(options, settings)
    report = new_report("lint", argv)
    read = _Read()
    seen: set[str] = set()
    for file, relative in lint_files(options.paths, settings, base):
        seen.add(file)
        _read_file(read, file, relative)
    _context(read, options.paths, settings, seen)
    findings: list[Finding] = []
    for facts, noqa in read.judged:
        findings += [
            f
            for f in judge_file(facts, read.project)
            if settings.reported(f.code, facts.relative)
            and not silenced(f.code, f.where.line if f.where else None, noqa)
        ]
    result = ProbeResult(probe="lint", findings=findings, subject=", ".join(str(p) for p in options.paths))
    # A linter's exit code: 1 when anything is reported, a warning too (the check fails), else 0.
    result.checks.append(
        Check("lint", "fail" if findings else "pass", f"{read.scanned} Python files read, {len(findings)} findings")
    )
    if read.unreadable:
        shown = ", ".join(read.unreadable[:3]) + (" ..." if len(read.unreadable) > 3 else "")
        said = f"{len(read.unreadable)} files are not Python this can parse: {shown}"
        result.checks.append(Check("unparsed", "info", said))
    result.measurements.update(
        files=read.scanned,
        unparsed=read.unreadable[:50],
        seconds=round(time.monotonic() - started, 3),
        config=settings.source,
    )
    report.results.append(result)
    return finish(report, started)
