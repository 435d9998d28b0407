"""A failure read from text, told the way `explain` and `run` both tell it: the class, the call path,
the ranks and threads that failed, the command that confirms it on the user's pipeline and the fix.
One place words it, so a log given to `explain` and an exception `run` caught in the command it
watched say the same thing."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from dflashdoctor.codes import finding
from dflashdoctor.explain.call_path import CallPath, call_path
from dflashdoctor.explain.classes import (
    CUT,
    NEEDLES,
    OTHER,
    SIGNALS,
    FailureClass,
    allocation_bytes,
    damaged_cache_root,
    failing_traceback,
    failure_class,
    other_cause,
)
from dflashdoctor.explain.reader import Reader, Reading, Traceback
from dflashdoctor.judges.base import size_text
from dflashdoctor.report import Finding, Where

MAX_RANKS_TOLD = 8  # ranks whose first error the finding quotes


@dataclass
class Diagnosis:
    reading: Reading
    found: FailureClass | None  # None: the text shows no failure
    traceback: Traceback | None  # the failure's
    path: CallPath

    @property
    def title(self) -> str:
        if self.found is None:
            return ""
        return other_cause(self.reading) if self.found is OTHER else self.found.name

    @property
    def exception(self) -> str:
        """The failure's own error line: its traceback's, else the log's last."""
        said = self.reading.exceptions
        if self.traceback is None or not self.traceback.exception:
            return said[-1][2] if said else ""
        own = self.traceback.exception
        if own.endswith("raised:"):  # dynamo's wrapper: the backend's own error is the next line
            after = [text for line, rank, text in said if line > self.traceback.start and rank == self.traceback.rank]
            following = after[after.index(own) + 1 :] if own in after else []
            return f"{own} {following[0]}" if following else own
        return own

    def confirm(self) -> str:
        """The class's command with the log's own names where it has them."""
        if self.found is None or not self.found.confirm:
            return ""
        # names from the log are another's text: quoted, a command copied from here runs only itself
        frame = self.path.user_frame
        script = shlex.quote(frame.path) if frame is not None and frame.path.endswith(".py") else "YOUR_STEP.py"
        if frame is not None and frame.function not in ("?", "<module>"):
            target = shlex.quote(f"{frame.path}:{frame.function}")
        else:
            target = "MODULE:WRAPPER"
        root = damaged_cache_root(self.reading)
        cache = f" --{root[0]}-dir {shlex.quote(root[1])}" if root else ""
        return self.found.confirm.format(script=script, target=target, cache=cache)

    def fix(self) -> str:
        confirm = self.confirm()
        return (self.found.fix if self.found else "") + (f" Confirm on your pipeline: `{confirm}`." if confirm else "")

    def story(self) -> str:
        """What the text shows, in sentences: the error, how much it asked for, then the path."""
        sentences = []
        if self.exception:
            sentences.append(f"The error: {self.exception.rstrip('.')}.")
        asked = allocation_bytes(self.reading)
        if asked is not None and self.found is not None and self.found.code == "log-flex-dense":
            sentences.append(f"It asked for {size_text(asked)} at once, the size of a dense score matrix.")
        return " ".join([*sentences, self.path_story()]).strip()

    def path_story(self) -> str:
        """Where the user's code is on the failing path, whose code the path went through, and the
        thread it ended."""
        sentences = []
        through = f"through {self.path.library}'s own code" if self.path.library else ""
        if self.path.user_frame is not None:
            via = f", {through}" if through else ""
            sentences.append(f"The user's innermost frame is {self.path.user_frame.label()}{via}.")
        elif through:
            sentences.append(f"The path runs {through}; no frame of the user's own code is in it.")
        if self.traceback is not None and self.traceback.thread:
            sentences.append(f"It ended thread {self.traceback.thread}.")
        if self.found is CUT and self.traceback is not None and self.traceback.frames:
            sentences.append(f"The last frame the log holds: {self.traceback.frames[-1].label()}.")
        return " ".join(sentences)

    def ranks(self) -> str:
        """Which ranks failed, first failure first, each with its first error (the others are most
        often the first one's consequence: a peer closed, a collective timed out)."""
        ranks = self.reading.ranks_first_failure_first()
        if not ranks:
            return ""
        errors = self.reading.rank_errors

        def told(rank: int) -> str:
            error = errors[rank]
            if error and error == self.exception:
                return f"rank {rank} (the error above)"
            return f"rank {rank}: {_short(error) if error else 'a traceback whose error line the log does not hold'}"

        more = f"; and {len(ranks) - MAX_RANKS_TOLD} more" if len(ranks) > MAX_RANKS_TOLD else ""
        return "; then ".join(told(rank) for rank in ranks[:MAX_RANKS_TOLD]) + more

    def evidence(self) -> dict[str, object]:
        reading = self.reading
        return {
            "signals": {name: [f"line {n}: {text}" for n, text in kept[:3]] for name, kept in reading.signals.items()},
            "ranks_failed": reading.ranks_first_failure_first(),
            "root_cause_rank": reading.root_cause_rank,
            "call_path": [f"{who}: {frame.label()}" for who, frame in self.path.owners[-12:]],
            "library": self.path.library,
            "thread": self.traceback.thread if self.traceback else "",
        }

    def finding(self) -> Finding:
        assert self.found is not None, "a finding needs a failure"
        frame = self.path.user_frame
        where = Where(file=frame.path, line=frame.line, function=frame.function) if frame is not None else None
        ranks = self.ranks()
        detail = self.story() + (f" Ranks that failed, first failure first: {ranks}." if ranks else "")
        evidence = self.evidence()
        return finding(self.found.code, self.title, detail=detail, where=where, evidence=evidence, fix=self.fix())


def _short(text: str, most: int = 120) -> str:
    """A line cut at a word, marked as cut."""
    if len(text) <= most:
        return text
    cut = text[:most].rsplit(" ", 1)[0]
    return f"{cut}…"


def diagnose(reading: Reading) -> Diagnosis:
    traceback = failing_traceback(reading)
    return Diagnosis(reading, failure_class(reading), traceback, call_path(traceback))


def diagnose_text(text: str, rank: int | None = None) -> Diagnosis:
    """One exception's printed traceback (what `run`'s agent records) read as a log of one rank."""
    reader = Reader(SIGNALS, NEEDLES)
    reader.feed_text(text, rank)
    return diagnose(reader.finish())


def is_known(diagnosis: Diagnosis) -> bool:
    """A class of its own, not "another cause" nor a cut traceback."""
    return diagnosis.found is not None and diagnosis.found not in (OTHER, CUT)
