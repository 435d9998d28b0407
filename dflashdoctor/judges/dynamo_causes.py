"""Dynamo's compile records, read: which record is a recompile-limit fallback or a skipped frame,
the name of the frame it is about, and the guard that kept failing, in the user's words.

Shared by every judge and by `dflashdoctor.testing`; the causes and fixes built on them live in
dense_cause.py, so that a report, a run and a failing test say the same thing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from dflashdoctor.probe_support import first_line
from dflashdoctor.records import CompileRecord
from dflashdoctor.report import Where

RECOMPILE_LIMIT_MARKERS = ("recompile limit", "recompile_limit", "cache_size_limit")
RAISED = re.compile(r"raised exception (\w+)\((.*?)\)\s*$", re.MULTILINE)
DENSE_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition")  # no Inductor: flex runs dense

_COMPILE_ID_PREFIX = re.compile(r"^\s*\d+/\d+:\s*")
_LOCATION = re.compile(r"(?P<file>\S+):(?P<line>\d+) in (?P<fn>\S+)\s*$")
_IMPORTED_GLOBAL = re.compile(r"G\['__import_(\w+?)'\]\.(\w+)")
_PLAIN_GLOBAL = re.compile(r"G\['(\w+)'\]")
_USER_STACK_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
_NOT_THE_USERS = (
    *("/site-packages/", "/dist-packages/", "/lib/python3"),
    *("/dflashdoctor/hooks/", "/dflashdoctor/agent/", "/dflashdoctor/testing/"),
)
_HINT = re.compile(r'\(HINT: guard on "([^"]+)"\)')


def recompile_limit_record(records: list[CompileRecord]) -> CompileRecord | None:
    """The first compile that failed because the recompile limit was hit."""
    for record in records:
        if is_recompile_limit(record):
            return record
    return None


def skipped_frame_record(records: list[CompileRecord]) -> CompileRecord | None:
    """The first compile whose frame raised, which makes dynamo skip that code for the process."""
    for record in records:
        if is_skipped_frame(record):
            return record
    return None


def is_recompile_limit(record: CompileRecord) -> bool:
    reason = (record.get("fail_reason") or "").lower()
    return any(marker in reason for marker in RECOMPILE_LIMIT_MARKERS)


def is_skipped_frame(record: CompileRecord) -> bool:
    return bool(record.get("fail_type")) and bool(RAISED.search(record.get("fail_reason") or ""))


def raised_exception(record: CompileRecord) -> str | None:
    """`Type(message)` of the exception that got a frame skipped, as dynamo wrote it."""
    match = RAISED.search(record.get("fail_reason") or "")
    return f"{match.group(1)}({match.group(2)})" if match else record.get("fail_type")


@dataclass(frozen=True)
class Guard:
    """A failed guard from dynamo's recompile reason, in the user's words where possible."""

    expression: str
    source: str
    where: Where | None
    hint: str | None = None  # the user's name for the guarded value, where dynamo gives one
    user_where: Where | None = None  # the innermost frame of dynamo's user stack outside installed libraries

    @property
    def name(self) -> str:
        """What the user calls the guarded value: dynamo's hint, else the last attribute of its
        source (`soft_cap` of `self._modules['layers']._modules['0'].soft_cap`)."""
        if self.hint:
            return self.hint
        head = self.expression.split(" ==", 1)[0].strip()
        return re.split(r"[.\]]", head)[-1].strip("'\"[") or head

    @property
    def user_line(self) -> Where | None:
        """The user's line for it: the guard's own location unless that is a library's, else the
        innermost user frame dynamo's stack names."""
        file = self.where.file if self.where is not None else None
        if file and os.path.isabs(file) and not is_library_file(file):  # dynamo cuts long paths short
            return self.where
        return self.user_where or self.where

    @property
    def reads_global(self) -> bool:
        return "global " in self.expression


def parse_guard(reason: str, *known_files: str | None) -> Guard:
    """Dynamo writes `0/7: G['__import_pkg_dot_mod'].name == 3  # source line  # path:20 in fn`.

    Global names come out as `global pkg.mod.name`; dynamo shortens long paths from the left, so a
    path that is a suffix of a known file (the target's own, the record's `guard_file`) is that file.
    """
    first = _COMPILE_ID_PREFIX.sub("", first_line(reason, ""))
    hint = _HINT.search(first)
    first = _HINT.sub("", first).rstrip()
    parts = [p.strip() for p in first.split("  # ")]
    expression = _IMPORTED_GLOBAL.sub(lambda m: f"global {m.group(1).replace('_dot_', '.')}.{m.group(2)}", parts[0])
    expression = _PLAIN_GLOBAL.sub(lambda m: f"global {m.group(1)}", expression)
    location = _LOCATION.search(parts[-1]) if len(parts) > 1 else None
    where = None
    if location:
        file = location.group("file")
        file = next((known for known in known_files if known and known.endswith(file.lstrip("."))), file)
        where = Where(file=file, line=int(location.group("line")), function=location.group("fn"))
    source = parts[1] if len(parts) > 2 else ""
    stack = [m for m in _USER_STACK_FRAME.finditer(reason.partition("User stack trace:")[2])]
    users = [m for m in stack if not is_library_file(m["file"])]
    user_where = Where(file=users[-1]["file"], line=int(users[-1]["line"]), function=users[-1]["fn"]) if users else None
    return Guard(
        expression=expression,
        source=source,
        where=where,
        hint=hint.group(1) if hint else None,
        user_where=user_where,
    )


def is_library_file(file: str) -> bool:
    """An installed library's file, or dflashdoctor's own instrumentation (a recorder's stand-in is
    on dynamo's user stack between the user's call and flex_attention)."""
    path = file.replace("\\", "/")
    return any(part in path for part in _NOT_THE_USERS)


def last_guard(records: list[CompileRecord], limit: CompileRecord | None, known_file: str | None) -> Guard:
    """The guard whose failures used up the recompile limit: the limit record's own reason, else the
    last recompile reason before it (`limit` None: the error was raised with no record of its own)."""
    with_reasons = [r for r in records if r.get("recompile_reason")]
    source = limit if limit and limit.get("recompile_reason") else (with_reasons[-1] if with_reasons else limit)
    if source is None:
        return parse_guard("", known_file)
    return parse_guard(source.get("recompile_reason") or "", known_file, source.get("guard_file"))


def why_the_guard_recompiles(guard: Guard) -> str:
    if not guard.reads_global:
        return ""
    return (
        "The guard is on a global Python value read while tracing (here by the score_mod or mask_mod), "
        "so every new value is a new graph. "
    )


def frame_name(record: CompileRecord, records: list[CompileRecord]) -> str | None:
    """The function a compile record is about. A failed compile may carry no name (torch 2.13
    leaves `co_name` empty on the recompile-limit record); the frame's other compiles, which share
    its frame id (`0/` of `0/2`), do. The last such record before it counts: ids restart after a
    `torch._dynamo.reset()`."""
    if record.get("co_name"):
        return record["co_name"]
    frame = str(record.get("compile_id") or "").split("/")[0]
    named = None
    for other in records:
        if other is record:
            break
        if other.get("co_name") and str(other.get("compile_id") or "").split("/")[0] == frame:
            named = other["co_name"]
    return named
