"""`lint [PATH...]`: the flex_attention patterns that make a long run dense or racy, found in the
source (lint/): one section of findings at file and line, in every format a report has (SARIF
puts them on a pull request's diff). Nothing is imported and torch need not be installed."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.errors import BadInput
from dflashdoctor.lint import sources
from dflashdoctor.lint.facts import file_facts, thread_facts
from dflashdoctor.lint.rules import judge_file
from dflashdoctor.placed_files import kind_of
from dflashdoctor.report import Check, ProbeResult, Report
from dflashdoctor.safe_fs import trusted_uids
from dflashdoctor.session import finish, new_report

_NEEDLE = b"flex_attention"
# lint-threaded-model-call needs a thread made (`Thread(`, a `ThreadPoolExecutor` or `ThreadPool`) and
# a word of a step: `.backward()`, an optimizer's `.step()`, a `...model`/`...Model` call, a triton
# launch, a wrapper made by torch.compile. A file without both cannot fire it and is not parsed for it.
_THREADS = (b"Thread(", b"ThreadPool")
_STEP_WORDS = (b"backward", b"step", b"odel", b"triton", b"compile")


@dataclass
class LintOptions:
    paths: list[Path] = field(default_factory=lambda: [Path(".")])


def python_files(paths: list[Path]) -> Iterator[Path]:
    """Every .py under the paths, in a stable order; links to folders are not followed (a loop, or
    a tree outside the repository)."""
    for path in paths:
        if path.is_file():
            yield path
            continue
        yield from (Path(found) for found in sources.python_files(os.fspath(path)) if not _others_link(found))


def _others_link(path: str) -> bool:
    """A link found in a folder that another user made: not followed (as root it could lead lint to
    a file only root may read, and the report would quote its lines). Yours and root's are."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISLNK(info.st_mode) and info.st_uid not in trusted_uids()


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


def lint(options: LintOptions, argv: list[str]) -> Report:
    for path in options.paths:
        _scannable(path)
    started = time.monotonic()
    report = new_report("lint", argv)
    findings, scanned, unreadable = [], 0, []
    for path in python_files(options.paths):
        try:
            data = sources.read_source(os.fspath(path))
        except OSError:
            unreadable.append(str(path))
            continue
        scanned += 1
        if _NEEDLE in data:
            read = file_facts
        elif any(word in data for word in _THREADS) and any(word in data for word in _STEP_WORDS):
            read = thread_facts
        else:  # no rule can fire on it: read, not parsed
            continue
        try:
            facts = read(str(path), data)  # decoded as Python decodes it: BOM, coding cookie, else UTF-8
        except (SyntaxError, ValueError, RecursionError):
            unreadable.append(str(path))
            continue
        findings += judge_file(facts)
    result = ProbeResult(probe="lint", findings=findings, subject=", ".join(str(p) for p in options.paths))
    errors = any(f.severity == "error" for f in findings)
    result.checks.append(
        Check("lint", "fail" if errors else "pass", f"{scanned} Python files read, {len(findings)} findings")
    )
    if unreadable:
        shown = ", ".join(unreadable[:3]) + (" ..." if len(unreadable) > 3 else "")
        said = f"{len(unreadable)} files are not Python this can parse: {shown}"
        result.checks.append(Check("unparsed", "info", said))
    result.measurements.update(files=scanned, unparsed=unreadable[:50], seconds=round(time.monotonic() - started, 3))
    report.results.append(result)
    return finish(report, started)
