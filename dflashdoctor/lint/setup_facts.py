"""What `init` needs to know about a repository, without importing it: the compiled flex_attention
wrappers and what they are bound to (lint's `ast` facts), and, found by pattern, transformers models
asked for flex attention, thread pools, and the programs that train (their entry point, whether
they start a process group). Shell scripts are searched for their launch lines (torchrun,
accelerate launch, srun, deepspeed).

Speed (issue 31 asks for under a second on 10,000 files): almost every file of a large tree says
none of this, so each file is first asked, with plain substring tests (C speed, one pass each, no
regex engine), whether it holds a word every pattern needs: `flex` (the HF path, the wrappers), and
in a file naming `torch`, `Thread` (until one file has shown a thread pool: the table names the
first) or `__main__` (entry points). Only a file that holds one meets the patterns, and only a file
that compiles flex is parsed. One regex alternation of those words was measured slower (0.17 s
against 0.07 s for the three substring tests over transformers' 51 MiB): CPython's engine tries every
position whose byte starts one of them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dflashdoctor.lint.facts import file_facts

_LAUNCHER = re.compile(
    r"^\s*(?:[A-Z_]+=\S+\s+)*"  # VAR=value prefixes
    r"(torchrun|accelerate launch|srun|deepspeed|python3?\s+-m\s+torch\.distributed\.run)\b.*$"
)


@dataclass
class Place:
    file: str  # relative to the repository root
    line: int
    what: str


@dataclass
class SetupFacts:
    wrappers: list[Place] = field(default_factory=list)  # what = "file.py:attr" as a target spells it
    wrapper_backends: dict[str, str | None] = field(default_factory=dict)  # target -> backend written
    hf_flex: list[Place] = field(default_factory=list)
    thread_pools: list[Place] = field(default_factory=list)  # the first file's that has any: the table names it
    trainers: list[Place] = field(default_factory=list)  # entry points that step an optimizer
    distributed: set[str] = field(default_factory=set)  # trainers' files that start a process group
    launchers: list[Place] = field(default_factory=list)


_IMPORTS_TORCH = re.compile(rb"^\s*(?:import|from)\s+torch\b", re.MULTILINE)
_HF_FLEX = re.compile(rb"""attn_implementation\s*=\s*["']flex_attention["']""")
_THREAD = re.compile(rb"\b(?:ThreadPoolExecutor|Thread)\(")
_MAIN = re.compile(rb"""^if\s+__name__\s*==\s*["']__main__["']""", re.MULTILINE)
_STEPS = re.compile(rb"\.(?:backward|step)\(")
_PROCESS_GROUP = re.compile(rb"\binit_process_group\(")
_COMPILES_FLEX = re.compile(rb"compile\(\s*[\w.]*flex")  # torch.compile(flex_attention ...), any alias of it


def _lines(pattern: re.Pattern[bytes], data: bytes) -> list[int]:
    """The line of each match, newlines counted once from the previous match, not from the top."""
    lines, line, counted = [], 1, 0
    for match in pattern.finditer(data):
        line += data.count(b"\n", counted, match.start())
        counted = match.start()
        lines.append(line)
    return lines


def _flex_words(facts: SetupFacts, relative: str, data: bytes) -> bool:
    """transformers' flex path asked for by name; whether a compile( call's first word names flex."""
    if b"flex_attention" in data:
        facts.hf_flex += [
            Place(relative, line, 'attn_implementation="flex_attention"') for line in _lines(_HF_FLEX, data)
        ]
    return b"compile(" in data and _COMPILES_FLEX.search(data) is not None


def _torch_words(facts: SetupFacts, relative: str, data: bytes) -> None:
    """Thread pools and entry points that step an optimizer, in a file that imports torch; whether
    such an entry point starts a process group (nothing else asks that of a file). Once a file has
    shown a thread pool no later file is searched for one: the table names the first, in the order
    of the walk, and no later one can change it."""
    threads = not facts.thread_pools and b"Thread" in data
    main = b"__main__" in data
    if not (threads or main) or _IMPORTS_TORCH.search(data) is None:
        return
    if threads:
        facts.thread_pools += [Place(relative, line, "a thread pool or thread") for line in _lines(_THREAD, data)]
    entry = _MAIN.search(data) if main else None
    if entry is not None and _STEPS.search(data):
        facts.trainers.append(Place(relative, data.count(b"\n", 0, entry.start()) + 1, "an entry point"))
        if _PROCESS_GROUP.search(data):
            facts.distributed.add(relative)


def _wrappers(facts: SetupFacts, relative: str, data: bytes) -> None:
    for call in file_facts(relative, data, follow=False).compiles:
        if not call.compiles_flex:
            continue
        for bound in call.reachable:
            target = f"{relative}:{bound}"
            facts.wrappers.append(Place(relative, call.line, target))
            facts.wrapper_backends[target] = call.backend


def python_setup(facts: SetupFacts, relative: str, data: bytes) -> None:
    """Add what one Python file says. Words are found by pattern (a suggestion that names its line
    is cheap to check, and parsing every file of a large tree is not); the wrappers, whose bound
    names matter, by `ast`, only in files where a compile( call's first word names flex, and last,
    so that a file that cannot be parsed still says its words (SyntaxError, ValueError and
    RecursionError propagate to the caller; bytes are decoded as Python decodes the file)."""
    compiles_flex = b"flex" in data and _flex_words(facts, relative, data)
    if b"torch" in data:
        _torch_words(facts, relative, data)
    if compiles_flex:
        _wrappers(facts, relative, data)


def shell_setup(facts: SetupFacts, relative: str, text: str) -> None:
    for number, line in enumerate(text.splitlines(), 1):
        if _LAUNCHER.match(line):
            facts.launchers.append(Place(relative, number, line.strip()[:200]))
