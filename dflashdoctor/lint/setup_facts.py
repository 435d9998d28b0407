"""What `init` needs to know about a repository, without importing it: the compiled flex_attention
wrappers (lint's `ast` facts: a name or attribute bound to `torch.compile(flex_attention)`, a
module-level `flex_attention = torch.compile(flex_attention)`, a function decorated
`@torch.compile` that calls it), transformers models asked for flex attention, threads that run a
model or a kernel step (lint/threads.py: what the thread's function calls, not that a thread is
made) and `nn.DataParallel` (its replicas run in threads), the programs that train (an entry point
that steps an optimizer, whether it starts a process group), and the documents teams write their
launch commands in (README, scripts, Makefile, CI workflows, pyproject.toml: lint/launches.py).

Speed (issue 31 asks for under a second on 10,000 files): almost every file of a large tree says
none of this, so each file is first asked, with plain substring tests (C speed, one pass each, no
regex engine), whether it holds a word a pattern needs: `flex` (the HF path, the wrappers), and in a
file naming `torch`, `Thread`/`DataParallel` or `__main__`. Only a file that holds one meets the
patterns, and only a file that compiles flex or makes threads is parsed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dflashdoctor.lint.facts import FileFacts, file_facts, thread_facts
from dflashdoctor.lint.threads import may_thread_a_step


@dataclass
class Place:
    file: str  # relative to the repository root
    line: int
    what: str


@dataclass
class SetupFacts:
    wrappers: list[Place] = field(default_factory=list)  # what = "file.py:attr" as a target spells it
    wrapper_backends: dict[str, str | None] = field(default_factory=dict)  # target -> backend written
    wrapper_how: dict[str, str] = field(default_factory=dict)  # target -> how it is compiled, as written
    instance_wrappers: set[str] = field(default_factory=set)  # made per instance (`self.attr`): not importable
    recompiled: set[str] = field(default_factory=set)  # bound inside a function: a re-compile, a helper's
    hf_flex: list[Place] = field(default_factory=list)
    threaded: list[Place] = field(default_factory=list)  # threads whose function runs a model or kernel step
    trainers: list[Place] = field(default_factory=list)  # entry points that step an optimizer
    distributed: set[str] = field(default_factory=set)  # trainers' files that start a process group
    documents: dict[str, str] = field(default_factory=dict)  # README, scripts, workflows: their text
    sources: dict[str, bytes] = field(default_factory=dict)  # entry points' and wrappers' files, for ranking


_IMPORTS_TORCH = re.compile(rb"^\s*(?:import|from)\s+torch\b", re.MULTILINE)
_HF_FLEX = re.compile(rb"""attn_implementation\s*=\s*["']flex_attention["']""")
_MAIN = re.compile(rb"""^if\s+__name__\s*==\s*["']__main__["']""", re.MULTILINE)
_STEPS = re.compile(rb"\.(?:backward|step)\(")
_PROCESS_GROUP = re.compile(rb"\binit_process_group\(")
_COMPILES_FLEX = re.compile(rb"compile\(\s*[\w.]*flex|@torch\.compile")
_DATA_PARALLEL = re.compile(rb"\bDataParallel\(")


def _lines(pattern: re.Pattern[bytes], data: bytes) -> list[int]:
    """The line of each match, newlines counted once from the previous match, not from the top."""
    lines, line, counted = [], 1, 0
    for match in pattern.finditer(data):
        line += data.count(b"\n", counted, match.start())
        counted = match.start()
        lines.append(line)
    return lines


def _flex_words(facts: SetupFacts, relative: str, data: bytes) -> bool:
    """transformers' flex path asked for by name; whether the file may compile flex."""
    if b"flex_attention" in data:
        facts.hf_flex += [
            Place(relative, line, 'attn_implementation="flex_attention"') for line in _lines(_HF_FLEX, data)
        ]
    return b"compile" in data and _COMPILES_FLEX.search(data) is not None


def _torch_words(facts: SetupFacts, relative: str, data: bytes) -> None:
    """Threads that step a model, nn.DataParallel, and entry points that step an optimizer, in a
    file that imports torch; whether such an entry point starts a process group."""
    threads = may_thread_a_step(data)  # as lint reads them
    parallel = b"DataParallel(" in data
    main = b"__main__" in data
    if not (threads or parallel or main) or _IMPORTS_TORCH.search(data) is None:
        return
    if threads:
        for call in thread_facts(relative, data).threaded:
            facts.threaded.append(
                Place(relative, call.line, f"{call.how} runs {call.target}, which reaches {call.step}")
            )
    if parallel:
        facts.threaded += [
            Place(relative, line, "nn.DataParallel, whose replicas run the model in threads")
            for line in _lines(_DATA_PARALLEL, data)
        ]
    entry = _MAIN.search(data) if main else None
    if entry is not None and _STEPS.search(data):
        facts.trainers.append(Place(relative, data.count(b"\n", 0, entry.start()) + 1, "an entry point"))
        facts.sources[relative] = data
        if _PROCESS_GROUP.search(data):
            facts.distributed.add(relative)


def _wrappers(facts: SetupFacts, relative: str, data: bytes) -> None:
    """Compiled flex wrappers by the name a target spells: bound to a name or class attribute, a
    module-level rebinding of flex_attention itself, or a module-level function decorated with
    @torch.compile that calls flex_attention."""
    found = file_facts(relative, data, follow=False)
    before = len(facts.wrappers)
    for call in found.compiles:
        if not call.compiles_flex:
            continue
        # every name it is bound to but a function's local variable (a helper's own re-compile)
        for bound in [b for b in call.bound_to if "." in b or not call.in_function]:
            target = f"{relative}:{bound}"
            if bound not in call.reachable:
                facts.instance_wrappers.add(target)  # `self.attr` in a method: made per instance
            if call.in_function:
                facts.recompiled.add(target)
            facts.wrappers.append(Place(relative, call.line, target))
            facts.wrapper_backends[target] = call.backend
            backend = f", backend={call.backend!r}" if call.backend else ""
            how = f"torch.compile(flex_attention{backend})"
            if call.compiled.endswith("()"):  # a factory's call
                how = f"{call.compiled}, which returns torch.compile(flex_attention),"
            facts.wrapper_how[target] = f"{how} at {relative}:{call.line}"
    for line, attr in found.forwarded_wrappers:
        target = f"{relative}:{attr}"
        facts.instance_wrappers.add(target)
        facts.wrappers.append(Place(relative, line, target))
        facts.wrapper_how[target] = f"torch.compile(flex_attention) at {relative}:{line}, set on each {attr}"
    _fronts(facts, relative, found)
    for raw in found.raw_calls:
        if raw.compiled_around and not raw.disabled_around and raw.cls is None and len(raw.enclosing) == 1:
            target = f"{relative}:{raw.enclosing[0]}"
            if all(place.what != target for place in facts.wrappers):
                facts.wrappers.append(Place(relative, raw.line, target))
                facts.wrapper_backends[target] = None
                facts.wrapper_how[target] = (
                    f"@torch.compile on {raw.enclosing[0]}, which calls flex_attention at {relative}:{raw.line}"
                )
    if len(facts.wrappers) > before:
        facts.sources[relative] = data


def _fronts(facts: SetupFacts, relative: str, found: FileFacts) -> None:
    """transformers' singleton, as teams copy it: the wrapper is made per instance
    (`self._compiled = torch.compile(flex_attention)` in a class's __init__), so it cannot be imported
    as a callable; the module-level function of that file that reaches it through the class and
    takes flex_attention's (q, k, v) is (`compile_friendly_flex_attention`). It stands before the
    instance's attribute."""
    made = [w for w in facts.instance_wrappers if w.startswith(f"{relative}:")]
    classes = {w.split(":", 1)[1].split(".", 1)[0] for w in made}
    for name, (line, positional, reads) in found.functions.items():
        if positional >= 3 and classes & reads:
            target = f"{relative}:{name}"
            facts.wrappers.append(Place(relative, line, target))
            facts.wrapper_how[target] = (
                f"{name}, which calls the per-instance wrapper of {', '.join(sorted(classes & reads))}"
            )


def python_setup(facts: SetupFacts, relative: str, data: bytes) -> None:
    """Add what one Python file says. Words are found by pattern (a suggestion that names its line
    is cheap to check, and parsing every file of a large tree is not); the wrappers and threads,
    whose names and calls matter, by `ast`, only in files that hold their words (SyntaxError,
    ValueError and RecursionError propagate to the caller; bytes are decoded as Python decodes
    the file)."""
    compiles_flex = b"flex" in data and _flex_words(facts, relative, data)
    if b"torch" in data:
        _torch_words(facts, relative, data)
    if compiles_flex:
        _wrappers(facts, relative, data)


def document_setup(facts: SetupFacts, relative: str, text: str) -> None:
    facts.documents[relative] = text
