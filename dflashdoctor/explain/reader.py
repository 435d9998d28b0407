"""A training run's log read as it comes, in one pass and bounded memory: several ranks interleaved
(`[rank3]:`, `[default0]:`, `0: ` prefixes), ANSI colours, `> ` quoting, tracebacks cut at either
end, chained exceptions, a traceback held in one line as a repr (`\\n  File "...`), C++ and MLIR
lines. What is kept: every traceback's frames and its exception line (the first and the last
tracebacks, a bounded number of each), each signal line a class looks for (first few of each, and a
count), the ranks that raised, in the order they first did. Nothing is imported and no line is kept
whole past a cap, so a 1 GB log, a 100 MB line without a newline, or a binary file costs what its
reading costs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

LINE_BYTES = 64 * 1024  # a longer line is cut: what matters in a log line is at its start
_CHUNK = 1 << 20
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f]")
_RANK = re.compile(r"^\s*(?:\[(rank|default)(\d+)\]:?|(\d{1,5}): (?=\S))\s?")
_THREAD = re.compile(r"^Exception in thread (.+?)(?: \(.*\))?:$")
_ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
# lines that say a rank failed without a traceback of its own: NCCL's watchdog, torchelastic's agent
_RANK_FAILED = re.compile(r"\[Rank (\d+)\] (Watchdog caught .*)|(failed \(exitcode: -?\d+\)) local_rank: (\d+)")
_QUOTE = re.compile(r"^(?:> ?)+")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in ([^\s,]+))?')
# dynamo names the frame it gave up on: `... for function 'forward' (/path/model.py:381)`
_FRAME_DYNAMO = re.compile(r"function '([\w<>]+)' \(([^()]+\.py):(\d+)\)")
_FRAME_BARE = re.compile(r"^\s*File \"?([^\",]+\.py)\"?, line (\d+)")
_EXCEPTION = re.compile(
    r"(?:^|^E\s+|: )((?:[A-Za-z_][\w]*\.)*(?=[A-Za-z_])\w*(?:Error|Exception|Failed|Unsupported|Exit|Interrupt|"
    r"OutOfResources|Timeout|Hit))(?::\s?(.*))?$"
)
_EXCEPTION_WORDS = (
    "Error",
    "Exception",
    "Failed",
    "Unsupported",
    "Exit",
    "Interrupt",
    "OutOfResources",
    "Timeout",
    "Hit",
)
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")
MAX_TRACEBACKS = 20  # the first and the last this many are kept
MAX_FRAMES = 400  # of one traceback: the innermost
MAX_SIGNAL_LINES = 5
MAX_RANKS = 4096  # ranks whose first error is kept
MAX_TEXT_CHARS = 1 << 20  # of one traceback given as a string: its end


@dataclass
class Frame:
    path: str
    line: int
    function: str

    def label(self) -> str:
        return f"{self.path}:{self.line} in {self.function}"


@dataclass
class Traceback:
    rank: int | None
    start: int  # the log's line number where it began
    frames: list[Frame] = field(default_factory=list)
    exception: str = ""  # `Type: message`, as printed (cut)
    chained: bool = False  # it follows "The above exception was the direct cause of ..."
    thread: str = ""  # the thread it ended, where Python said ("Exception in thread pair-0:")


@dataclass
class Reading:
    """What one pass over the log kept."""

    lines: int = 0
    tracebacks: list[Traceback] = field(default_factory=list)
    dropped_tracebacks: int = 0
    exceptions: list[tuple[int, int | None, str]] = field(default_factory=list)  # (line, rank, text), bounded
    failed_ranks: list[int] = field(default_factory=list)  # in the order their first error was printed
    rank_errors: dict[int, str] = field(default_factory=dict)  # each rank's first error line, "" until one
    root_cause_rank: int | None = None  # torchrun's "Root Cause (first observed failure)" rank
    signals: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def ranks_first_failure_first(self) -> list[int]:
        """The failed ranks, the launcher's root cause first where it named one (it timed the
        failures; a log's order is the order of flushes), else in the order the log shows them."""
        root = self.root_cause_rank
        if root is None or root not in self.rank_errors:
            return list(self.failed_ranks)
        return [root, *(rank for rank in self.failed_ranks if rank != root)]


def blocks(stream: BinaryIO) -> Iterator[bytes]:
    """The stream in blocks of whole lines (about a MiB each), each line at most LINE_BYTES: a line
    without end is cut, never held whole."""
    pending = b""
    cut = False
    while chunk := stream.read(_CHUNK):
        pending += chunk
        end = pending.rfind(b"\n")
        if end < 0:
            if len(pending) > LINE_BYTES:
                if not cut:
                    yield pending[:LINE_BYTES]
                cut, pending = True, b""
            continue
        block, pending = pending[: end + 1], pending[end + 1 :]
        if cut:  # the rest of a line already cut
            block = block[block.find(b"\n") + 1 :]
            cut = False
        long = len(block) > LINE_BYTES and max(map(len, block.split(b"\n"))) > LINE_BYTES
        yield _capped(block) if long else block
    if pending and not cut:
        yield pending[:LINE_BYTES]


def _capped(block: bytes) -> bytes:
    return b"\n".join(line[:LINE_BYTES] for line in block.split(b"\n"))


def clean(raw: bytes) -> tuple[int | None, str]:
    """A line's rank (if prefixed) and its text: decoded (bad bytes replaced), ANSI and other
    control characters gone, quoting and rank prefixes taken off."""
    text = raw.decode("utf-8", errors="replace")
    if not text.isprintable():  # ANSI colours, tabs, CR: most lines hold none
        text = _ANSI.sub("", text.replace("\t", "    ").rstrip("\r"))
    if text[:1] == ">":
        text = _QUOTE.sub("", text)
    rank = None
    for _ in range(3):  # launchers stack prefixes (`[default1]:[rank1]: `): the global rank wins
        match = _RANK.match(text) if text[:1] in "[0123456789 " else None
        if match is None:
            break
        told = int(match.group(2) or match.group(3))
        rank = told if rank is None or match.group(1) == "rank" else rank
        text = text[match.end() :]
    return rank, text


def expanded(text: str) -> list[str]:
    """A traceback printed as a repr on one line (`...\\n  File "x", line 3 ...`) as its lines."""
    if '\\n  File "' in text or "\\nTraceback" in text:
        return text.replace("\\'", "'").split("\\n")
    return [text]


class Reader:
    """Feed lines; `reading` holds what was kept."""

    def __init__(self, patterns: dict[str, re.Pattern[str]], needles: tuple[str, ...]) -> None:
        """`needles`: lowercase words one of which every pattern's match holds; a line with none
        (most of a training log: its steps) is asked no regex, which was most of the time."""
        self.patterns = patterns
        self.needles = needles
        starts = ("traceback", "file ", "function '", "during handling", "the above exception")
        self._block_words = tuple(w.encode() for w in (*needles, *starts, *(w.lower() for w in _EXCEPTION_WORDS)))
        self.reading = Reading()
        self._open: dict[int | None, Traceback] = {}
        self._chained: set[int | None] = set()
        self._thread: dict[int | None, str] = {}  # "Exception in thread NAME:" until its traceback opens
        self._root_cause_next = False

    def feed(self, lines: Iterable[bytes]) -> Reading:
        self.feed_lines(lines)
        return self.finish()

    def feed_blocks(self, chunks: Iterable[bytes]) -> Reading:
        """Blocks of whole lines (`blocks`): one that holds none of the words any line that matters
        holds (a run of training steps) is only counted."""
        for block in chunks:
            lowered = block.lower()
            if not any(word in lowered for word in self._block_words):
                self.reading.lines += block.count(b"\n") + (not block.endswith(b"\n"))
                continue
            self.feed_lines(block.removesuffix(b"\n").split(b"\n"))
        return self.finish()

    def feed_text(self, text: str, rank: int | None = None) -> None:
        """One printed traceback held as a string (what `run`'s agent records per uncaught exception),
        read as lines of `rank`: its end at most MAX_TEXT_CHARS, each line at most LINE_BYTES."""
        prefix = f"[rank{rank}]: ".encode() if rank is not None and 0 <= rank < 1 << 20 else b""
        data = text[-MAX_TEXT_CHARS:].encode("utf-8", "replace")
        self.feed_lines(prefix + line[:LINE_BYTES] for line in data.split(b"\n"))

    def feed_lines(self, lines: Iterable[bytes]) -> None:
        for raw in lines:
            rank, text = clean(raw)
            for part in expanded(text):
                self._line(rank, part)

    def finish(self) -> Reading:
        for traceback in list(self._open.values()):
            self._close(traceback)
        return self.reading

    def _line(self, rank: int | None, text: str) -> None:
        reading = self.reading
        reading.lines += 1
        number = reading.lines
        stripped = text.strip()
        lowered = text.lower()
        named = any(needle in lowered for needle in self.needles)
        for name, pattern in self.patterns.items() if named else ():
            if pattern.search(text):
                reading.counts[name] = reading.counts.get(name, 0) + 1
                kept = reading.signals.setdefault(name, [])
                if len(kept) < MAX_SIGNAL_LINES:
                    kept.append((number, stripped[:500]))
        if "Watchdog caught" in text or "failed (exitcode" in text:
            told = _RANK_FAILED.search(text)
            if told is not None:
                self._rank_failed(int(told.group(1) or told.group(4)), told.group(2) or told.group(3))
        if stripped.startswith("Traceback (most recent call last)") or stripped.startswith("Original Traceback"):
            if rank is not None:
                self._rank_failed(rank, "")
            if rank in self._open:
                self._close(self._open.pop(rank))
            self._open[rank] = Traceback(rank, number, chained=rank in self._chained, thread=self._thread.pop(rank, ""))
            self._chained.discard(rank)
            return
        if stripped.startswith("Exception in thread "):
            thread = _THREAD.match(stripped)
            if thread is not None:
                self._thread[rank] = thread.group(1)[:200]
            return
        if stripped.startswith("Root Cause (first observed failure)"):
            self._root_cause_next = True
            return
        if self._root_cause_next and stripped.startswith("rank"):
            told = _ROOT_CAUSE_RANK.match(stripped)
            if told is not None and reading.root_cause_rank is None:
                reading.root_cause_rank = int(told.group(1))
            self._root_cause_next = False
            return
        if any(stripped.startswith(words) for words in _CHAIN):
            self._chained.add(rank)
            return
        frame = (_FRAME.search(text) or _FRAME_BARE.search(text)) if "File " in text else None
        if frame is not None:
            current = self._open.get(rank)
            if current is None:  # a traceback cut at its head: its frames still count
                current = self._open[rank] = Traceback(rank, number)
            current.frames.append(Frame(frame.group(1), int(frame.group(2)), _function(frame)))
            if len(current.frames) > MAX_FRAMES:
                del current.frames[0]
            return
        dynamo = _FRAME_DYNAMO.search(text) if "function '" in text else None
        if dynamo is not None:  # a frame of its own, dynamo's word for where it stopped
            stopped = Frame(dynamo.group(2), int(dynamo.group(3)), dynamo.group(1))
            self._close(Traceback(rank, number, [stopped], stripped[:500]))
        exception = _EXCEPTION.search(stripped) if any(word in stripped for word in _EXCEPTION_WORDS) else None
        if exception is not None:
            self._exception(rank, number, stripped)

    def _exception(self, rank: int | None, number: int, text: str) -> None:
        reading = self.reading
        if len(reading.exceptions) < 200:
            reading.exceptions.append((number, rank, text[:500]))
        if rank is not None:
            self._rank_failed(rank, text)
        current = self._open.pop(rank, None)
        if current is None:
            current = Traceback(rank, number, chained=rank in self._chained)
        current.exception = text[:500]
        self._close(current)

    def _rank_failed(self, rank: int, error: str) -> None:
        """A rank failed: the first time, in order; its first error line once one is printed."""
        reading = self.reading
        if rank not in reading.rank_errors:
            if len(reading.rank_errors) >= MAX_RANKS:
                return
            reading.failed_ranks.append(rank)
            reading.rank_errors[rank] = ""
        if error and not reading.rank_errors[rank]:
            reading.rank_errors[rank] = error[:500]

    def _close(self, traceback: Traceback) -> None:
        self._open.pop(traceback.rank, None)
        kept = self.reading.tracebacks
        kept.append(traceback)
        if len(kept) > 2 * MAX_TRACEBACKS:  # keep the first and the last MAX_TRACEBACKS
            del kept[MAX_TRACEBACKS]
            self.reading.dropped_tracebacks += 1


def _function(match: re.Match[str]) -> str:
    return (match.group(3) if match.re is _FRAME and match.group(3) else "?").rstrip(":")
