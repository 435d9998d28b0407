"""The files whose code a traced run executed with `exec` (runpy.run_path, a launcher's
`exec(open(f).read())`, a test runner loading a conftest): a rebinding made there is gone from
sys.modules and from the stack by the time a dense call is judged, yet it is the first place a user
puts a debugging switch.

Python's audit hook (`exec` event, whose argument is the code object) sees each such execution.
An audit hook cannot be removed, so one hook per process is installed on first use and records only
while a `Recording` is open; outside one it returns at once. Files without a name (`<string>`) are
not kept; at most _MAX_FILES are.

Probed side: standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
from types import CodeType
from typing import Any

from dflashdoctor.hooks.compile_origin import LIBRARY_DIRS  # imports run through `exec` too

_MAX_FILES = 200
_lock = threading.Lock()
_installed = False
_open: list[Recording] = []  # the recordings now open


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "exec" or not _open:
        return
    code = args[0] if args else None
    if not isinstance(code, CodeType) or not code.co_filename:
        return
    name = code.co_filename
    if name.startswith("<"):  # a string run with exec(): kept with the line that ran it
        caller = sys._getframe(1)
        place = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        if not os.path.abspath(caller.f_code.co_filename).startswith(LIBRARY_DIRS):
            for recording in _open:
                if len(recording.strings) < _MAX_FILES:
                    recording.strings.append((place, code))
        return
    if os.path.abspath(name).startswith(LIBRARY_DIRS):
        return
    for recording in _open:
        if name not in recording.files and len(recording.files) < _MAX_FILES:
            recording.files.append(name)


class Recording:
    """Context manager: `files` lists the files executed with `exec` while it was open, `strings`
    the code run from strings (`exec(text)`), each with the `file:line` that ran it."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self.strings: list[tuple[str, CodeType]] = []

    def __enter__(self) -> Recording:
        global _installed
        with _lock:
            if not _installed:
                try:
                    sys.addaudithook(_audit)
                    _installed = True
                except Exception:  # a runtime that refuses audit hooks: nothing recorded, nothing lost
                    return self
            _open.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _open[:] = [recording for recording in _open if recording is not self]
