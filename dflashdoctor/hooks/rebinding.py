"""Where a name that should hold a compiled flex_attention wrapper was rebound to the raw function.

torchtitan-style code keeps its compiled wrapper on a class (`Wrapper._compiled_flex_attn =
torch.compile(flex_attention)`) and calls it by that name; a later assignment of the raw
`flex_attention` to the same name (a debugging switch, a monkeypatch in a test harness, a
context-parallel shim) makes every call dense while the call line still reads "compiled". The call
line is where the dense kernel runs; the line to change is the assignment. This reads the call's
source for the name it calls, then the source of the user's loaded modules for the assignments of
that name, without importing or running anything.

Probed side: standard library only.
"""

from __future__ import annotations

import ast
import dis
import linecache
import os
import sys
from types import CodeType, FrameType

from dflashdoctor.hooks.compile_origin import LIBRARY_DIRS, library_of
from dflashdoctor.records import RawRebound

_MAX_FILES = 200
_MAX_DEPTH = 4
_STORES = ("STORE_ATTR", "STORE_NAME", "STORE_GLOBAL")
_MAX_BYTES = 2_000_000
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dflashdoctor's own files
_LIBRARY_DIRS = (*LIBRARY_DIRS, _PACKAGE + os.sep)


def called_name(file: str, line: int) -> str | None:
    """The dotted name the call on `file:line` calls (`FlexAttentionWrapper._compiled_flex_attn`)."""
    source = linecache.getline(file, line).strip()
    if not source:
        return None
    try:
        tree = ast.parse(source.rstrip("(,\\"), mode="exec")
    except (SyntaxError, ValueError, RecursionError):
        head = source.split("(", 1)[0].split("=")[-1].strip().removeprefix("return ").strip()
        return head if head.replace(".", "").replace("_", "").isalnum() else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            return dotted_name(node.func)
    return None


def rebinding(
    file: str,
    line: int,
    stack_files: tuple[str, ...] = (),
    strings: tuple[tuple[str, CodeType], ...] = (),
) -> RawRebound | None:
    """Where the name called on `file:line` was last assigned something other than a
    `torch.compile(...)`, when it was also assigned a compiled wrapper (or looks like one).

    `stack_files` are the user's files that were on the stack when the call was made: the launcher
    script (run as __main__, so gone from sys.modules once it returns), a file run through runpy, a
    conftest; the first place a user rebinds a name. `strings` is code run from a string with
    `exec` and the line that ran it: one that stores the name is the rebinding, ahead of any
    assignment in the source text (which may sit in a branch that never ran)."""
    name = called_name(file, line)
    if not name or name in ("flex_attention", "torch.nn.attention.flex_attention.flex_attention"):
        return None
    attr = name.rsplit(".", 1)[-1]
    compiled: list[tuple[str, int]] = []
    raw: list[tuple[str, int]] = []
    ran = [place for place, code in strings if _stores(code, attr)]
    for path in _user_files(file, stack_files):
        for assigned_line, value in _assignments(path, attr):
            (compiled if _is_compile_call(value) else raw).append((path, assigned_line))
    if ran and (compiled or "compile" in attr.lower()):
        raw = [(ran[-1].rpartition(":")[0], int(ran[-1].rpartition(":")[2]))]
    if not raw or not (compiled or "compile" in attr.lower()):
        return None
    rebound_file, rebound_line = raw[-1]
    return {
        "name": name,
        "file": rebound_file,
        "line": rebound_line,
        "compiled_at": f"{compiled[0][0]}:{compiled[0][1]}" if compiled else None,
    }


def _stores(code: CodeType, attr: str, depth: int = 0) -> bool:
    """The code (or a function defined in it) assigns `attr` as a name or an attribute."""
    try:
        for instruction in dis.get_instructions(code):
            if instruction.opname in _STORES and instruction.argval == attr:
                return True
    except Exception:  # a code object this Python cannot read: no evidence
        return False
    return depth < _MAX_DEPTH and any(
        _stores(const, attr, depth + 1) for const in code.co_consts if isinstance(const, CodeType)
    )


def dotted_name(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of names and attributes; None for anything else (a call, a subscript)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _is_compile_call(value: ast.AST) -> bool:
    return isinstance(value, ast.Call) and (dotted_name(value.func) or "").endswith("compile")


def _assignments(path: str, attr: str) -> list[tuple[int, ast.AST]]:
    try:
        if os.path.getsize(path) > _MAX_BYTES:
            return []
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[tuple[int, ast.AST]] = []
    for node in ast.walk(tree):
        targets: list[ast.expr]
        value: ast.expr
        if isinstance(node, ast.Assign):
            targets, value = list(node.targets), node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            name = (
                target.id
                if isinstance(target, ast.Name)
                else target.attr
                if isinstance(target, ast.Attribute)
                else None
            )
            if name == attr:
                found.append((node.lineno, value))
    return sorted(found, key=lambda item: item[0])


def user_files_on_stack(frame: FrameType | None) -> tuple[str, ...]:
    """The files of the user's frames from `frame` outwards, innermost first: not the standard
    library, installed packages, dflashdoctor, or code without a file (`<string>` of an exec)."""
    files: list[str] = []
    while frame is not None and len(files) < _MAX_FILES:
        path = frame.f_code.co_filename
        if not path.startswith("<"):
            path = os.path.abspath(path)
            if not path.startswith(_LIBRARY_DIRS) and library_of(path) is None and path not in files:
                files.append(path)
        frame = frame.f_back
    return tuple(files)


def _user_files(first: str, stack_files: tuple[str, ...]) -> list[str]:
    """The call's own file, the user's files that were on its stack, then the source files of
    loaded modules outside the standard library and installed packages (the user's project), at
    most _MAX_FILES."""
    files = [os.path.abspath(first)]
    files += [f for f in stack_files if f not in files]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            continue
        path = os.path.abspath(path)
        if path.startswith(_LIBRARY_DIRS) or library_of(path) is not None or path in files:
            continue
        files.append(path)
        if len(files) >= _MAX_FILES:
            break
    return files
