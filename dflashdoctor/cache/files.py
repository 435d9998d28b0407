"""Checks of one cache file by what it claims to be. Each returns the problem in words, or None.

Nothing is imported, executed or unpickled: JSON is parsed, Python source is `compile()`d, binaries
are read to their headers. What no check can see is in docs/commands/cache.md (triton stores no checksums).
Paths are plain strings: on Python 3.11 pathlib interns every part it parses, so a Path per cache
entry would grow memory with the number of entries.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

ELF_MAGIC = b"\x7fELF"
BINARY_SUFFIXES = (".cubin", ".hsaco", ".so", ".o")
TEXT_SUFFIXES = (".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".source", ".cpp", ".h", ".asm", ".spv")
_TEXT_SAMPLE = 4096


def elf_problem(path: str, size: int) -> str | None:
    """An ELF file is whole if every table its header points to lies inside the file: section
    headers sit at the end of cubins and shared objects, so a truncated file loses them first."""
    with open(path, "rb") as handle:
        header = handle.read(64)
    if header[:4] != ELF_MAGIC:
        return f"not an ELF binary (starts with {header[:4]!r})"
    if len(header) < 52 or header[4] not in (1, 2) or header[5] not in (1, 2):
        return "ELF header truncated or invalid"
    wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
    if wide and len(header) < 64:
        return "ELF header truncated"
    if wide:
        phoff, shoff = struct.unpack_from(order + "QQ", header, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", header, 0x36)
    else:
        phoff, shoff = struct.unpack_from(order + "II", header, 0x1C)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", header, 0x2A)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    if end > size:
        return f"truncated: its header points to byte {end}, the file has {size}"
    return None


def text_problem(path: str) -> str | None:
    """IR and source are text: a NUL byte or undecodable bytes in the first 4 KiB means damage."""
    with open(path, "rb") as handle:
        sample = handle.read(_TEXT_SAMPLE)
    if b"\x00" in sample:
        return "text file holds NUL bytes"
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(sample) - 4:  # a multi-byte character cut by the sample's end is fine
            return f"text file is not UTF-8 at byte {exc.start}"
    return None


def load_json(path: str) -> tuple[Any, str | None]:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle), None
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 JSON ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except (ValueError, RecursionError) as exc:  # a 5000-digit number; brackets nested 100,000 deep
        return None, f"invalid JSON ({type(exc).__name__}: no JSON torch or triton writes)"


def python_problem(path: str) -> str | None:
    """Generated Python must at least compile; it is never imported or run."""
    try:
        with open(path, "rb") as handle:
            source = handle.read()
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"does not compile: {exc.msg} (line {exc.lineno})"
    except ValueError as exc:  # NUL bytes in source
        return f"does not compile: {exc}"
    except (RecursionError, MemoryError) as exc:  # an expression nested or chained past the compiler
        return f"does not compile: {type(exc).__name__} (no code torch generates)"
    return None


def by_suffix(path: str, size: int) -> str | None:
    """The check a file's extension calls for; None when it passes or has no check."""
    if size == 0:
        return "empty file"
    name = os.path.basename(path)
    if name.endswith(BINARY_SUFFIXES):
        return elf_problem(path, size)
    if name.endswith(".json"):
        return load_json(path)[1]
    if name.endswith(".py"):
        return python_problem(path)
    if name.endswith(TEXT_SUFFIXES):
        return text_problem(path)
    return None
