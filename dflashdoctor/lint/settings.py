"""Which findings `lint` reports and where it looks, as a team sets it: the rule codes (short, in
the form `# noqa` and ruff's parser take, `DFD001`; or the long code a report names), `select` and
`ignore`, `exclude` and `per-file-ignores` (gitignore-style globs), from `[tool.dflashdoctor.lint]`
in the nearest pyproject.toml (or `--config`), then the command line's options over it.

    [tool.dflashdoctor.lint]
    select = ["DFD"]                 # every rule on by default; DFD007 (raw on purpose) only when named
    ignore = ["DFD006"]
    exclude = ["third_party/", "*_pb2.py"]
    per-file-ignores = { "scripts/debug_*.py" = ["DFD001"] }

The file is read as any configuration another user may have placed is read: a regular file (no
link followed), at most 4 MiB, its errors one line each."""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from dflashdoctor.errors import BadInput
from dflashdoctor.placed_files import MIB, PlacedFileError, read_placed
from dflashdoctor.trust import file_reason

# short code -> the code a finding carries (codes.py); the order is the rules' order in the docs
RULE_CODES = {
    "DFD001": "lint-raw-flex-call",
    "DFD002": "lint-wrapper-not-inductor",
    "DFD003": "lint-wrapper-rebound",
    "DFD004": "lint-mod-reads-global",
    "DFD005": "lint-wrapper-static-varying",
    "DFD006": "lint-threaded-model-call",
    "DFD007": "lint-raw-flex-call-on-purpose",
}
SHORT_CODES = {long: short for short, long in RULE_CODES.items()}
OFF_BY_DEFAULT = frozenset({"lint-raw-flex-call-on-purpose"})
_CONFIG_BYTES = 4 * MIB
_KEYS = {"select", "ignore", "extend-select", "exclude", "per-file-ignores"}


def codes_of(words: list[str], where: str) -> frozenset[str]:
    """The long codes a list names: `DFD001`, a prefix (`DFD`, `DFD00`), `ALL`, or a long code."""
    chosen: set[str] = set()
    for word in words:
        if not isinstance(word, str):
            raise BadInput(f"{where}: a rule code must be a string, not {type(word).__name__}")
        upper = word.strip().upper()
        if upper == "ALL":
            chosen |= set(RULE_CODES.values())
        elif word.strip() in SHORT_CODES:
            chosen.add(word.strip())
        elif upper.startswith("DFD") and (matched := [c for s, c in RULE_CODES.items() if s.startswith(upper)]):
            chosen |= set(matched)
        else:
            known = ", ".join(RULE_CODES)
            raise BadInput(f"{where}: unknown rule code {word!r}; known: {known} (or a prefix, or ALL)")
    return frozenset(chosen)


@dataclass
class LintSettings:
    select: frozenset[str] = frozenset(set(RULE_CODES.values()) - OFF_BY_DEFAULT)
    exclude: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, frozenset[str]] = field(default_factory=dict)
    source: str | None = None  # the file the table came from

    def reported(self, code: str, relative: str) -> bool:
        """Whether a finding of `code` in the file at `relative` (to the project) is reported."""
        if code not in self.select:
            return False
        return not any(code in codes for glob, codes in self.per_file_ignores.items() if matches(glob, relative))

    def excluded(self, relative: str) -> bool:
        return any(matches(glob, relative) for glob in self.exclude)


def matches(glob: str, relative: str) -> bool:
    """A gitignore-style glob against a path relative to the project: `name` anywhere (a file or a
    folder on the way), `dir/` a folder, `/top` or `a/b` anchored at the project, `**` any depth."""
    if len(glob) > _GLOB_CHARS:
        return False
    text = relative.replace("\\", "/")
    folder_only = glob.endswith("/")
    bare = glob.strip("/")
    if "/" not in glob.rstrip("/"):  # a name: any component (a folder's only, for `dir/`)
        names = text.split("/")[:-1] if folder_only else text.split("/")
        pattern = re.sub(r"\*+", "*", bare)
        return any(fnmatch.fnmatchcase(name, pattern) for name in names)
    # anchored: the path itself, or a folder on its way (a position where a `/` follows)
    return any(
        (k < len(text) and text[k] == "/") or (k == len(text) and not folder_only) for k in _glob_reach(bare, text)
    )


_GLOB_CHARS = 512  # a longer glob is nobody's: matched as text, never built into a regex


def _tokens(pattern: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(pattern):
        for token in ("**/", "**", "*", "?"):
            if pattern.startswith(token, i):
                if not (tokens and tokens[-1] == token and token != "?"):  # a run of one is one
                    tokens.append(token)
                i += len(token)
                break
        else:
            tokens.append(pattern[i])
            i += 1
    return tokens


def _glob_reach(pattern: str, text: str) -> set[int]:
    """Where in `text` a glob can end (`*` stops at `/`, `**` crosses folders, `**/` is any number of
    whole folders): a set of positions carried one token at a time, linear in the text for each
    token. A regex of the glob backtracks: `*a*a*a...b` in a .gitignore hung it."""
    reached = {0}
    for token in _tokens(pattern):
        if not reached:
            return reached
        start = min(reached)
        if token == "**":
            reached = set(range(start, len(text) + 1))
        elif token == "**/":
            reached = reached | {k for k in range(start + 1, len(text) + 1) if text[k - 1] == "/"}
        elif token == "*":
            extended: set[int] = set()
            for j in sorted(reached):
                k = j
                while k not in extended:
                    extended.add(k)
                    if k >= len(text) or text[k] == "/":
                        break
                    k += 1
            reached = extended
        elif token == "?":
            reached = {j + 1 for j in reached if j < len(text) and text[j] != "/"}
        else:
            reached = {j + 1 for j in reached if j < len(text) and text[j] == token}
    return reached


def find_config(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start`, if it has a [tool.dflashdoctor.lint] table:
    the project's own, never one further up (another user's /tmp/pyproject.toml must not silence
    root's lint), nor past a `.git`. One that another user could change, or that is not a regular
    file (a link, a FIFO), is refused in one line rather than read or passed over."""
    folder = start.resolve()
    for candidate in [folder, *folder.parents]:
        path = candidate / "pyproject.toml"
        if os.path.lexists(path):
            reason = file_reason(path) if not os.path.islink(path) else None
            if reason is not None:
                raise BadInput(f"refusing lint's configuration {path}: {reason}; pass --config {path} to use it")
            data = _bytes(path)
            return path if b"dflashdoctor" in data and _table(path, explicit=False) is not None else None
        if os.path.lexists(candidate / ".git"):
            return None
    return None


def _bytes(path: Path) -> bytes:
    try:
        return read_placed(path, _CONFIG_BYTES)
    except PlacedFileError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None


@overload
def _table(path: Path, *, explicit: Literal[True]) -> dict[str, Any]: ...  # else it raises
@overload
def _table(path: Path, *, explicit: bool) -> dict[str, Any] | None: ...
def _table(path: Path, *, explicit: bool) -> dict[str, Any] | None:
    try:
        data = tomllib.loads(_bytes(path).decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise BadInput(f"{path} is not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("dflashdoctor", {}) if path.name == "pyproject.toml" else data
    lint = table.get("lint") if isinstance(table, dict) else None
    if lint is None and path.name != "pyproject.toml":
        lint = table  # a dflashdoctor.toml given with --config: its [lint] table, or the keys bare
    if lint is None:
        if explicit:
            raise BadInput(f"{path} has no [tool.dflashdoctor.lint] table")
        return None
    if not isinstance(lint, dict):
        raise BadInput(f"{path}: tool.dflashdoctor.lint must be a table")
    return lint


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadInput(f"{where} must be a list of strings")
    return list(value)


def load(
    config: Path | None,
    start: Path,
    *,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    exclude: list[str] | None = None,
) -> LintSettings:
    """The settings: the table (--config, else the nearest pyproject.toml that has one), then the
    command line's `--select` (replacing), `--ignore` and `--exclude` (adding)."""
    settings = LintSettings()
    path = config if config is not None else find_config(start)
    table = _table(path, explicit=True) if path is not None else {}
    where = f"{path} [tool.dflashdoctor.lint]"
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} in {where}; known keys: {', '.join(sorted(_KEYS))}")
    if "select" in table:
        settings.select = codes_of(_strings(table["select"], f"select in {where}"), where)
    settings.select |= codes_of(_strings(table.get("extend-select", []), f"extend-select in {where}"), where)
    settings.select -= codes_of(_strings(table.get("ignore", []), f"ignore in {where}"), where)
    settings.exclude = _strings(table.get("exclude", []), f"exclude in {where}")
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise BadInput(f"per-file-ignores in {where} must be a table of globs to lists of codes")
    settings.per_file_ignores = {
        glob: codes_of(_strings(codes, f"per-file-ignores {glob!r} in {where}"), where)
        for glob, codes in per_file.items()
    }
    if select is not None:
        settings.select = codes_of(select, "--select")
    settings.select -= codes_of(ignore or [], "--ignore")
    settings.exclude += exclude or []
    settings.source = str(path) if path is not None else None
    return settings
