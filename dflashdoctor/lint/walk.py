"""The files `lint` judges, as a linter chooses them: every .py below a folder given, less what
no team writes (sources.SKIPPED: version control, caches, build output), virtual environments
wherever they sit (a folder holding `pyvenv.cfg` or `conda-meta`, or a `site-packages`), what the
repository's `.gitignore` files ignore, and the settings' `exclude`. A file named on the command
line (a pre-commit hook's) is judged unless `exclude` names it. Links to folders are never followed;
a link to a file that another user made is not followed either (as root it could lead lint to a
file only root may read, and the report would quote its lines).

Each file comes with its path relative to the project (`base`), which `exclude`, `per-file-ignores`
and the test/benchmark rule read."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dflashdoctor.lint import sources
from dflashdoctor.lint.settings import LintSettings, matches
from dflashdoctor.placed_files import MIB, PlacedFileError, read_placed
from dflashdoctor.safe_fs import trusted_uids

_VENV_MARKERS = ("pyvenv.cfg", "conda-meta")
_IGNORE_BYTES = MIB
_IGNORE_RULES = 2000  # each is tried on every path below its folder: a .gitignore past this is data


@dataclass(frozen=True)
class Rule:
    """One .gitignore line, relative to the folder of its file."""

    folder: str  # relative to the walk's top, "" for the top
    glob: str
    negated: bool


def _ignore_rules(folder: str, relative: str) -> list[Rule]:
    """The rules of `folder`/.gitignore (a regular file, no link followed, 1 MiB at most)."""
    try:
        text = read_placed(os.path.join(folder, ".gitignore"), _IGNORE_BYTES).decode("utf-8", errors="replace")
    except (OSError, PlacedFileError):
        return []
    rules = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line[1:] if negated else line.removeprefix("\\")
        if glob:
            rules.append(Rule(relative, glob, negated))
    return rules[:_IGNORE_RULES]


def _ignored(rules: list[Rule], relative: str, is_folder: bool) -> bool:
    """git's answer for one path: the last rule that matches decides."""
    ignored = False
    for rule in rules:
        inside = relative if not rule.folder else relative.removeprefix(rule.folder + "/")
        if rule.folder and inside == relative:
            continue  # the rule's folder is not above this path
        if rule.glob.endswith("/") and not is_folder:
            continue
        if _matches_here(rule.glob, inside):
            ignored = not rule.negated
    return ignored


def _matches_here(glob: str, inside: str) -> bool:
    """The glob against this path itself (its folders were decided as the walk entered them)."""
    name = inside.rsplit("/", 1)[-1]
    bare = glob.rstrip("/")
    if "/" in bare:
        return matches(bare if bare.startswith("/") else "/" + bare, inside)
    return matches(bare, name)


def _venv(folder: str) -> bool:
    return any(os.path.lexists(os.path.join(folder, marker)) for marker in _VENV_MARKERS)


def _others_link(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISLNK(info.st_mode) and info.st_uid not in trusted_uids()


def relative_to(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def lint_files(paths: list[Path], settings: LintSettings, base: Path) -> Iterator[tuple[str, str]]:
    """(the path as lint names it, its path relative to `base`) for each file lint judges, in a
    stable order."""
    for path in paths:
        if not path.is_dir():
            relative = relative_to(path, base)
            if not settings.excluded(relative):
                yield str(path), relative
            continue
        yield from _folder_files(str(path), settings, base)


def _shown(folder: str, name: str) -> str:
    """A file's path as lint names it: below the current folder without `./` (`pkg/a.py`)."""
    return os.path.join(folder, name).removeprefix("./")


def _folder_files(top: str, settings: LintSettings, base: Path) -> Iterator[tuple[str, str]]:
    top_relative = relative_to(Path(top), base)
    rules_at: dict[str, list[Rule]] = {}
    for folder, subfolders, files in os.walk(top):
        here = os.path.relpath(folder, top)
        here = "" if here == "." else here.replace(os.sep, "/")
        rules = rules_at.get(os.path.dirname(here) if here else "", []) if here else []
        rules = rules + (_ignore_rules(folder, here) if ".gitignore" in files else [])
        rules_at[here] = rules
        kept = []
        for name in sorted(subfolders):
            inside = f"{here}/{name}" if here else name
            child = os.path.join(folder, name)
            if sources.skipped(name) or name == "site-packages" or _ignored(rules, inside, True):
                continue
            if settings.excluded(_joined(top_relative, inside)):
                continue
            if not _venv(child):
                kept.append(name)
        subfolders[:] = kept
        for name in sorted(files):
            inside = f"{here}/{name}" if here else name
            full = _shown(folder, name)
            if not name.endswith(".py") or _ignored(rules, inside, False) or _others_link(full):
                continue
            if not settings.excluded(_joined(top_relative, inside)):
                yield full, _joined(top_relative, inside)


def _joined(top_relative: str, inside: str) -> str:
    return inside if top_relative in ("", ".") else f"{top_relative}/{inside}"
