"""The lint rules: each turns one kind of fact (lint/facts.py) into findings at the file and line.

Each rule has a case that fires and one that does not in docs/commands/lint.md, and none may fire on
transformers' or torch's own source (tests/integration/test_lint.py scans the installed packages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dflashdoctor.codes import finding
from dflashdoctor.lint.facts import FileFacts, RawCall
from dflashdoctor.lint.project import Project
from dflashdoctor.report import Finding, Where

_INDUCTOR = {None, "inductor"}


@dataclass(frozen=True)
class CallKind:
    """What a flex_attention call runs, from the source: `compiled`, `deliberate-raw` (raw on
    purpose: a test's eager reference, a benchmark beside its compiled twin, a compile switch's
    eager branch) or `risk` (raw where training may run it); `why` is the evidence."""

    kind: str
    why: str


_ASIDE_FOLDERS = {"test", "tests", "testing", "benchmark", "benchmarks", "bench", "benches"}
_ASIDE_FOLDERS |= {"examples", "example", "demo", "demos", "notebooks", "tutorials"}  # show both paths, on purpose
_ASIDE_FILE = re.compile(r"^(test_.*|.*_test|conftest|bench.*|.*_bench|.*benchmark.*)\.py$")
# A function whose name says it computes the eager answer on purpose (`ref_attention`, `eager_flex`).
_REFERENCE = re.compile(r"(^|_)(ref|reference|eager|naive|baseline|golden|expected|unfused|dense|debug)(_|$)", re.I)


def aside(path: str) -> str | None:
    """A test, a benchmark or an example by its path: its raw calls are there on purpose (an eager
    reference, a comparison, a demo of the eager path), not on the team's training path."""
    parts = Path(path).parts
    if _ASIDE_FOLDERS & {part.lower() for part in parts[:-1]}:
        return "a test, benchmark or example folder"
    return "a test or benchmark file" if parts and _ASIDE_FILE.match(parts[-1]) else None


def call_kind(call: RawCall, facts: FileFacts, project: Project) -> CallKind:
    """Whether a raw-looking call runs compiled, raw on purpose, or raw where training runs it."""
    if call.compiled_around and not call.disabled_around:
        return CallKind("compiled", "a function around it is decorated with @torch.compile")
    if call.compiled_by is not None:
        return CallKind("compiled", f"the name is rebound to a compiled wrapper: {call.compiled_by}")
    compiled = next((c for n in call.enclosing if (c := project.compiled_function(n))), None)
    if compiled and not call.disabled_around:
        return CallKind("compiled", f"its function is compiled: {compiled}")
    in_model = call.cls is not None or any(
        n in facts.called_in_methods or n in facts.registered_attention for n in call.enclosing
    )
    model = project.model_compiled()
    if in_model and model and not call.disabled_around:
        return CallKind("compiled", f"it runs inside a model compiled whole at {model}")
    if (where := aside(facts.relative or facts.path)) is not None:
        return CallKind("deliberate-raw", f"in {where}")
    if call.disabled_around:
        return CallKind("risk", "a function around it is excluded from compiling (torch.compiler.disable)")
    reference = next((n for n in call.enclosing if _REFERENCE.search(n)), None)
    if reference is not None:
        return CallKind("deliberate-raw", f"in {reference}, an eager reference by its name")
    if call.switch_line is not None:
        return CallKind("deliberate-raw", f"on a compile switch's branch (the `if` at line {call.switch_line})")
    if call.beside_compiled:
        return CallKind("deliberate-raw", "its function also calls the compiled wrapper: a comparison")
    return CallKind("risk", "nothing compiles it")


def raw_calls(facts: FileFacts, project: Project) -> list[Finding]:
    """`flex_attention(...)` called where nothing compiles it: its dense kernel runs, materialising
    the whole score matrix forward and backward. Raw on purpose (tests, benchmarks, eager
    references, a compile switch's eager side) is its own code, off unless selected."""
    found = []
    for call in facts.raw_calls:
        kind = call_kind(call, facts, project)
        where = Where(file=facts.path, line=call.line, function=call.function, column=call.column)
        if kind.kind == "risk":
            found.append(
                finding(
                    "lint-raw-flex-call",
                    "flex_attention is called raw, outside any compiled region: it runs its dense kernel",
                    detail="Outside torch.compile, flex_attention builds the full float32 score matrix (forward "
                    "and backward) instead of a fused kernel."
                    + (
                        f" It is called through `{call.called_as}`, bound to flex_attention itself at line "
                        f"{call.alias_line}."
                        if call.alias_line
                        else ""
                    )
                    + (
                        " The function around it is excluded from compiling (torch.compiler.disable)."
                        if call.disabled_around
                        else ""
                    ),
                    where=where,
                    evidence={"alias_line": call.alias_line} if call.alias_line else {},
                    fix="Call a wrapper made once with `torch.compile(flex_attention)` (Inductor), or compile the "
                    "function that calls it.",
                )
            )
        elif kind.kind == "deliberate-raw":
            found.append(
                finding(
                    "lint-raw-flex-call-on-purpose",
                    f"flex_attention is called raw on purpose ({kind.why}): its dense kernel runs here",
                    where=where,
                    fix="Nothing, if this is an eager reference; training code calls the compiled wrapper.",
                )
            )
    return found


def wrapper_backends(facts: FileFacts) -> list[Finding]:
    """A wrapper compiled with a backend that is not Inductor (eager, aot_eager) compiles nothing
    fused: every call runs the dense kernel. (A wrapper made inside a function under
    torch.compiler.disable is still compiled: the disable covers that function's own frame.)"""
    return [
        finding(
            "lint-wrapper-not-inductor",
            f"{call.compiled} is compiled with backend={call.backend!r}, which generates no kernels: "
            "flex_attention runs its dense kernel",
            where=Where(file=facts.path, line=call.line),
            evidence={"backend": call.backend, "bound_to": call.bound_to},
            fix="Compile flex_attention with Inductor: `torch.compile(flex_attention)` (no backend=, or "
            "backend='inductor').",
        )
        for call in facts.compiles
        if call.compiles_flex and call.backend is not None and call.backend not in _INDUCTOR
    ]


def _rebound(facts: FileFacts, line: int, target: str, value: str, raw: bool, column: int = 1) -> Finding:
    return finding(
        "lint-wrapper-rebound",
        f"{target}, a compiled flex_attention wrapper, is rebound to {value}",
        detail="Every call through this name after this line runs what it was rebound to"
        + (": torch's raw flex_attention, its dense kernel." if raw else "."),
        where=Where(file=facts.path, line=line, column=column),
        evidence={"target": target, "value": value},
        fix=f"Leave {target} the compiled wrapper; if a test needs the raw function, patch it there and restore it.",
    )


def rebindings(facts: FileFacts, project: Project) -> list[Finding]:
    """A name or attribute that held a compiled wrapper assigned raw flex_attention (torchtitan's
    `FlexAttentionWrapper._compiled_flex_attn = flex_attention`), in the wrapper's file or any other
    (a launcher script's patch): the calls through it run raw. A test may do it on purpose (and
    restore it), so a test's is not reported; nor is a rebinding to anything else (a test restoring
    the wrapper it saved)."""
    if aside(facts.relative or facts.path) is not None:
        return []
    found = [_rebound(facts, r.line, r.target, r.value, True) for r in facts.rebindings if r.to_raw_flex]
    seen = {r.line for r in facts.rebindings}
    for line, text in facts.raw_assignments:
        wrapper = next((w for w in project.wrappers if "." in w and (text == w or text.endswith("." + w))), None)
        if wrapper is not None and line not in seen:
            found.append(
                _rebound(
                    facts, line, text, f"flex_attention (the wrapper is made at {project.wrappers[wrapper]})", True
                )
            )
    return found


def global_reads(facts: FileFacts) -> list[Finding]:
    """A score_mod or mask_mod that reads a module-level number some function rebinds: dynamo guards
    on the number, recompiles on each new value until its limit, then runs flex_attention eagerly."""
    return [
        finding(
            "lint-mod-reads-global",
            f"{read.function}, a score_mod/mask_mod, reads the module-level number {read.name}, which is rebound",
            detail=f"torch.compile specialises on the value of `{read.name}`: each new value recompiles, and past "
            "the recompile limit the call falls back to the dense kernel.",
            where=Where(file=facts.path, line=read.line, function=read.function),
            fix=f"Pass `{read.name}` as a tensor (a 0-d tensor the mod indexes or compares), or close the mod over a "
            "tensor that you update in place.",
        )
        for read in facts.global_reads
    ]


def static_wrappers(facts: FileFacts) -> list[Finding]:
    """A wrapper compiled with dynamic=False that this file calls with a length that changes: one
    graph per length until dynamo's recompile limit (8 by default), then the dense kernel for every
    later length (what the runtime commands report as recompile-limit-static-shapes)."""
    return [
        finding(
            "lint-wrapper-static-varying",
            f"{found.wrapper} is compiled with dynamic=False and called with lengths that vary "
            f"(line {found.call_line})",
            detail=f"Line {found.call_line} calls {found.called} inside the loop at line {found.loop_line} with a "
            "tensor whose size the loop changes"
            + (f" ({found.calls} such calls)" if found.calls > 1 else "")
            + ". With dynamic=False each new length compiles a new graph; past dynamo's recompile limit (8 by "
            "default) every later length runs flex_attention's dense kernel.",
            where=Where(file=facts.path, line=found.line),
            evidence={"wrapper": found.wrapper, "call_line": found.call_line, "loop_line": found.loop_line},
            fix=f"Drop dynamic=False where {found.wrapper} is compiled (or mark the sequence dimension dynamic, "
            "`torch._dynamo.mark_dynamic(tensor, dim)`), or pad the lengths to a few fixed sizes.",
        )
        for found in facts.static_varying
    ]


def threaded_steps(facts: FileFacts) -> list[Finding]:
    """A thread pool or thread that runs a model, a training step or a kernel launch: threads that
    enter one Triton/FLA autotuner together corrupt its per-call state."""
    return [
        finding(
            "lint-threaded-model-call",
            f"{found.how} runs {found.target} on threads, which reaches {found.step} (line {found.step_line})",
            detail="Each thread enters the same Triton/FLA autotuners; two inside one at once corrupt its "
            "per-call state (a crash, or silently wrong tuning: the runtime finding is concurrent-autotuner-entry)."
            + (f" Reached through {' -> '.join(found.via)}." if found.via else ""),
            where=Where(file=facts.path, line=found.line),
            evidence={"target": found.target, "step_line": found.step_line, "via": found.via},
            fix="Run the data-parallel pairs in processes (torchrun, one per GPU), or hold one lock around the "
            "autotuned call so that one thread at a time enters it.",
        )
        for found in facts.threaded
    ]


_FILE_RULES = (wrapper_backends, global_reads, static_wrappers, threaded_steps)
_PROJECT_RULES = (raw_calls, rebindings)


def judge_file(facts: FileFacts, project: Project | None = None) -> list[Finding]:
    """Every rule's findings on one file, judged with what the project's other files compile (a
    file alone: with its own)."""
    project = project if project is not None else Project.of(facts)
    found = [f for rule in _PROJECT_RULES for f in rule(facts, project)]
    found += [f for rule in _FILE_RULES for f in rule(facts)]
    return sorted(found, key=lambda f: (f.where.line if f.where and f.where.line else 0, f.code))
