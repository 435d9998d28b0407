"""The lint rules: each turns one kind of fact (lint/facts.py) into findings at the file and line.

Each rule has a case that fires and one that does not in docs/commands/lint.md, and none may fire on
transformers' or torch's own source (tests/integration/test_lint.py scans the installed packages).
"""

from __future__ import annotations

from dflashdoctor.codes import finding
from dflashdoctor.lint.facts import FileFacts
from dflashdoctor.report import Finding, Where

_INDUCTOR = {None, "inductor"}


def raw_calls(facts: FileFacts) -> list[Finding]:
    """`flex_attention(...)` called where nothing compiles it: its dense kernel runs, materialising
    the whole score matrix forward and backward."""
    return [
        finding(
            "lint-raw-flex-call",
            "flex_attention is called raw, outside any compiled region: it runs its dense kernel",
            detail="Outside torch.compile, flex_attention builds the full float32 score matrix (forward and "
            "backward) instead of a fused kernel."
            + (
                " The function around it is excluded from compiling (torch.compiler.disable)."
                if call.disabled_around
                else ""
            ),
            where=Where(file=facts.path, line=call.line, function=call.function),
            fix="Call a wrapper made once with `torch.compile(flex_attention)` (Inductor), or compile the function "
            "that calls it.",
        )
        for call in facts.raw_calls
        if not call.compiled_around or call.disabled_around
    ]


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


def rebindings(facts: FileFacts) -> list[Finding]:
    """A name or attribute that held a compiled wrapper assigned something else later (torchtitan's
    `FlexAttentionWrapper._compiled_flex_attn = flex_attention`): the calls through it run raw."""
    return [
        finding(
            "lint-wrapper-rebound",
            f"{rebound.target}, a compiled flex_attention wrapper, is rebound to {rebound.value}",
            detail="Every call through this name after this line runs what it was rebound to"
            + (": torch's raw flex_attention, its dense kernel." if rebound.to_raw_flex else "."),
            where=Where(file=facts.path, line=rebound.line),
            evidence={"target": rebound.target, "value": rebound.value},
            fix=f"Leave {rebound.target} the compiled wrapper; if a test needs the raw function, patch it there "
            "and restore it.",
        )
        for rebound in facts.rebindings
    ]


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


RULES = (raw_calls, wrapper_backends, rebindings, global_reads, static_wrappers, threaded_steps)


def judge_file(facts: FileFacts) -> list[Finding]:
    return [found for rule in RULES for found in rule(facts)]
