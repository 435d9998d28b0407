"""What runs now, while a command runs several probes: on a terminal a live list (each probe running
with its time so far, each finished one with its verdict and time), cleared when the report prints;
in a CI log, where nothing redraws, one plain line per finished probe. On stderr, so `--json` keeps
stdout to its one document. Stopped (Ctrl-C, SIGTERM), it says which probes were running and for
how long: a blank terminal that ends with no word was what users saw before."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from dflashdoctor.report import Report

_MARKS = {"pass": ("✔", "green"), "fail": ("✘", "bold red"), "error": ("!", "bold magenta")}


class Progress:
    """Probes started and finished, told as they happen; thread-safe (probes run in a pool)."""

    def __init__(self, command: str, stream: TextIO | None = None) -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.live_display = self.stream.isatty()
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}  # probe -> when it started
        self._done: list[tuple[str, str, float]] = []  # (probe, verdict, seconds)
        self._live: Live | None = None
        self._cut_short: dict[str, float] | None = None  # what ran when the stop came: said once stopped

    def __enter__(self) -> Progress:
        if self.live_display:
            console = Console(file=self.stream)
            self._live = Live(get_renderable=self._view, console=console, transient=True, refresh_per_second=4)
            self._live.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.stop()
        if kind is not None and not issubclass(kind, Exception):  # Ctrl-C, SIGTERM: say what was cut short
            self.interrupted()
            with self._lock:
                cut = self._cut_short or {}
            if cut:
                running = ", ".join(f"{name} ({seconds:.0f} s in)" for name, seconds in cut.items())
                self._say(f"dflashdoctor {self.command}: stopped while running {running}; no report")

    def interrupted(self) -> None:
        """The stop came (before the running probes are stopped): what runs now was cut short, and
        how those probes end from here is the stop's doing, not theirs, so it is not told."""
        with self._lock:
            if self._cut_short is None:
                now = time.monotonic()
                self._cut_short = {name: now - since for name, since in self._running.items()}

    def started(self, probe: str) -> None:
        with self._lock:
            self._running[probe] = time.monotonic()

    def finished(self, probe: str, report: Report) -> None:
        with self._lock:
            since = self._running.pop(probe, time.monotonic())
            seconds = time.monotonic() - since
            self._done.append((probe, report.verdict, seconds))
            stopping = self._cut_short is not None
        if not self.live_display and not stopping:
            self._say(f"dflashdoctor {self.command}: {probe} {report.verdict} in {seconds:.1f} s")

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # stderr closed or gone: the report still comes
            print(line, file=self.stream, flush=True)

    def _view(self) -> Group:
        with self._lock:
            now = time.monotonic()
            rows = [
                Text.assemble("  ", _MARKS.get(verdict, ("?", "")), f" {name}  {seconds:.1f} s")
                for name, verdict, seconds in self._done
            ]
            rows += [Text(f"  … {name}  {now - since:.0f} s", style="cyan") for name, since in self._running.items()]
        head = Text(f"dflashdoctor {self.command}: {len(self._running)} running, {len(self._done)} done", style="bold")
        return Group(head, *rows)
