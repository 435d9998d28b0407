"""What `init` needs to know about a repository, without importing it: the compiled flex_attention
wrappers and what they are bound to (lint's `ast` facts), and, found by pattern, transformers models
asked for flex attention, thread pools, and the programs that train (their entry point, whether
they start a process group). Shell scripts are searched for their launch lines (torchrun,
accelerate launch, srun, deepspeed)."""

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
    thread_pools: list[Place] = field(default_factory=list)
    trainers: list[Place] = field(default_factory=list)  # entry points that step an optimizer
    distributed: set[str] = field(default_factory=set)  # files that start a process group
    launchers: list[Place] = field(default_factory=list)


_IMPORTS_TORCH = re.compile(rb"^\s*(?:import|from)\s+torch\b", re.MULTILINE)
_HF_FLEX = re.compile(rb"""attn_implementation\s*=\s*["']flex_attention["']""")
_THREAD = re.compile(rb"\b(?:ThreadPoolExecutor|Thread)\(")
_MAIN = re.compile(rb"""^if\s+__name__\s*==\s*["']__main__["']""", re.MULTILINE)
_STEPS = re.compile(rb"\.(?:backward|step)\(")
_PROCESS_GROUP = re.compile(rb"\binit_process_group\(")
_COMPILES_FLEX = re.compile(rb"compile\(\s*[\w.]*flex")  # torch.compile(flex_attention ...), any alias of it


def _lines(pattern: re.Pattern[bytes], data: bytes) -> list[int]:
    return [data.count(b"\n", 0, match.start()) + 1 for match in pattern.finditer(data)]


def python_setup(facts: SetupFacts, relative: str, data: bytes) -> None:
    """Add what one Python file says. Words are found by pattern (a suggestion that names its line
    is cheap to check, and parsing every file of a large tree is not); the wrappers, whose bound
    names matter, by `ast`, only in files where a compile( call's first word names flex
    (SyntaxError, ValueError and UnicodeDecodeError propagate to the caller)."""
    imports_torch = _IMPORTS_TORCH.search(data) is not None
    facts.hf_flex += [Place(relative, line, 'attn_implementation="flex_attention"') for line in _lines(_HF_FLEX, data)]
    if imports_torch:
        facts.thread_pools += [Place(relative, line, "a thread pool or thread") for line in _lines(_THREAD, data)]
        main = _lines(_MAIN, data)
        if main and _STEPS.search(data):
            facts.trainers.append(Place(relative, main[0], "an entry point"))
    if _PROCESS_GROUP.search(data):
        facts.distributed.add(relative)
    if not _COMPILES_FLEX.search(data):
        return
    for call in file_facts(relative, data.decode("utf-8")).compiles:
        if not call.compiles_flex:
            continue
        for bound in call.reachable:
            target = f"{relative}:{bound}"
            facts.wrappers.append(Place(relative, call.line, target))
            facts.wrapper_backends[target] = call.backend


def shell_setup(facts: SetupFacts, relative: str, text: str) -> None:
    for number, line in enumerate(text.splitlines(), 1):
        if _LAUNCHER.match(line):
            facts.launchers.append(Place(relative, number, line.strip()[:200]))
