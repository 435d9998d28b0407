"""Whose `torch.compile` call it is when a library makes it: the user's line and setting behind it.

HF's Trainer compiles through accelerate (`TrainingArguments(torch_compile_backend=...)` becomes
accelerate's `TorchDynamoPlugin`, and accelerate calls `torch.compile(model, **kwargs)` in its own
file); `nn.Module.compile` calls `torch.compile` from torch's module.py. A fix that says "edit
`torch.compile(...)` at accelerate/accelerator.py:1600" points into site-packages, which no user
edits. The frame that compiled is therefore followed outwards to the first frame of the user's code,
and the option that led there is looked for where a user sets it: the user's files on that stack
(a keyword such as `torch_compile_backend=` on a line of theirs), then the command line
(`--torch_compile_backend aot_eager` read by HfArgumentParser), then the environment
(ACCELERATE_DYNAMO_BACKEND). Nothing is imported or run; files are read through linecache.

Probed side: standard library only.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass
from types import FrameType

# the standard library's and installed packages' folders: no user's code (shared by the hooks)
LIBRARY_DIRS = tuple(
    os.path.abspath(p) + os.sep
    for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    if p
)
_MAX_FRAMES = 64
_MAX_LINES = 20_000
_PLUGIN_TYPES = ("TorchDynamoPlugin",)  # accelerate's compile settings, held in a user's local
_MAX_DISTRIBUTIONS = 2000
_MAX_RECORD_BYTES = 4 << 20

# (library, the options a user sets for it, the environment variable that sets them)
_FRAMEWORKS = (
    ("transformers", ("torch_compile_backend", "torch_compile_mode", "torch_compile"), None),
    ("accelerate", ("dynamo_backend", "dynamo_plugin", "TorchDynamoPlugin"), "ACCELERATE_DYNAMO_BACKEND"),
    ("lightning", ("compile",), None),
    ("torch", (".compile(",), None),
)


@dataclass(frozen=True)
class CompileOrigin:
    """The user's side of a compile call a library made."""

    library: str  # the outermost library on the way (transformers over accelerate): the one the user called
    library_at: str  # `file:line` of the library line that called torch.compile
    file: str  # the user's frame that led there
    line: int
    setting: str | None  # `torch_compile_backend="aot_eager"`, as the user wrote it
    setting_at: str | None  # `file:line`, `the command line` or `the environment`


@functools.lru_cache(maxsize=4096)
def library_of(file: str) -> str | None:
    """The installed package a file belongs to (`accelerate`, `transformers`, `torch`), else None:
    under the standard library or site-packages, or under a folder on sys.path whose installed
    distributions list it (`pip install --target DIR` then PYTHONPATH=DIR, as on a cluster)."""
    path = os.path.abspath(file)
    for root in LIBRARY_DIRS:
        if path.startswith(root):
            rest = path[len(root) :].split(os.sep)
            if rest and rest[0] in ("site-packages", "dist-packages") and len(rest) > 1:
                return rest[1].removesuffix(".py")
            return rest[0].removesuffix(".py") if rest else None
    for entry in list(sys.path):
        root = os.path.abspath(entry or ".") + os.sep
        if path.startswith(root):
            top = path[len(root) :].split(os.sep)[0]
            if top in _installed_tops(root):
                return top.removesuffix(".py")
    return None


@functools.lru_cache(maxsize=64)
def _installed_tops(folder: str) -> frozenset[str]:
    """The top-level names the distributions installed in `folder` hold, from their RECORD files
    (an editable install's RECORD lists no project files, so a user's own package stays theirs)."""
    tops: set[str] = set()
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".dist-info")][:_MAX_DISTRIBUTIONS]
    except OSError:
        return frozenset()
    for name in names:
        try:
            with open(os.path.join(folder, name, "RECORD"), encoding="utf-8", errors="replace") as record:
                for line in record.read(_MAX_RECORD_BYTES).splitlines():
                    top = line.split(",", 1)[0].split("/", 1)[0]
                    if top and not top.endswith((".dist-info", ".data")) and top != "..":
                        tops.add(top)
        except OSError:
            continue
    return frozenset(tops)


def origin(caller: FrameType, own_files: tuple[str, ...]) -> CompileOrigin | None:
    """Where the user asked for the compile that a library's frame `caller` made; None when the
    caller is the user's own code, or no user frame is found within _MAX_FRAMES."""
    first = library_of(caller.f_code.co_filename)
    if first is None:
        return None
    libraries = [first]
    frame: FrameType | None = caller.f_back
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        file = frame.f_code.co_filename
        owner = library_of(file)
        if owner is None and not file.startswith("<") and not os.path.abspath(file).startswith(own_files):
            break
        if owner is not None and owner not in libraries:
            libraries.append(owner)
        frame = frame.f_back
    else:
        return None
    assert frame is not None
    library = libraries[-1]
    setting, setting_at = _setting(library, libraries, frame)
    return CompileOrigin(
        library=library,
        library_at=f"{caller.f_code.co_filename}:{caller.f_lineno}",
        file=frame.f_code.co_filename,
        line=frame.f_lineno,
        setting=setting,
        setting_at=setting_at,
    )


def _setting(library: str, libraries: list[str], user: FrameType) -> tuple[str | None, str | None]:
    """The option that asked for this compile, where the user wrote it."""
    options = [o for lib, opts, _ in _FRAMEWORKS if lib in libraries for o in opts]
    made = _plugin_assignment(user)
    if made is not None:
        return made
    frame: FrameType | None = user
    seen: set[str] = set()
    while frame is not None and len(seen) < 8:
        file = frame.f_code.co_filename
        if file not in seen and library_of(file) is None and not file.startswith("<"):
            seen.add(file)
            found = _in_file(file, options)
            if found:
                return found
        frame = frame.f_back
    for i, arg in enumerate(sys.argv):
        name = arg.lstrip("-").split("=", 1)[0]
        if arg.startswith("--") and name in options:
            value = arg.split("=", 1)[1] if "=" in arg else (sys.argv[i + 1] if i + 1 < len(sys.argv) else "")
            return f"--{name} {value}".strip(), "the command line"
    for lib, _, variable in _FRAMEWORKS:
        if lib in libraries and variable and os.environ.get(variable):
            return f"{variable}={os.environ[variable]}", "the environment"
    return None, None


def _plugin_assignment(user: FrameType) -> tuple[str, str] | None:
    """A compile plugin the user's frame holds in a local (`plugin = TorchDynamoPlugin(backend=...)`):
    the line that assigned that name is the setting, whichever branch of the file ran (a name in
    f_locals was assigned; an `Accelerator(dynamo_backend=...)` on another branch was not)."""
    names = [name for name, value in list(user.f_locals.items()) if type(value).__name__ in _PLUGIN_TYPES]
    if not names:
        return None
    lines = linecache.getlines(user.f_code.co_filename)[: user.f_lineno]
    for i in range(len(lines), 0, -1):
        if lines[i - 1].strip().startswith(f"{names[0]} ="):
            return lines[i - 1].strip()[:160], f"{user.f_code.co_filename}:{i}"
    return None


def _in_file(file: str, options: list[str]) -> tuple[str, str] | None:
    """The last line of `file` that sets one of `options` as a keyword (`name=`), the most specific
    option first: a backend names the fix better than `torch_compile=True`."""
    lines = linecache.getlines(file)[:_MAX_LINES]
    for option in options:
        needle = option if option.endswith("(") else f"{option}="
        hits = [i for i, text in enumerate(lines, 1) if needle in text.replace(" =", "=").replace("= ", "=")]
        if hits:
            text = lines[hits[-1] - 1].strip()
            return text[:160], f"{file}:{hits[-1]}"
    return None
