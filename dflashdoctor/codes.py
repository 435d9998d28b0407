"""The stable finding codes and their severities.

Tests, CI and users key on these ids, so a code is never renamed; `finding()` takes the severity
from here so that no probe or judge can raise a code at a severity other than the documented one.
docs/codes.md is written from this table (`python3 -m dflashdoctor.codes > docs/codes.md`; a test
keeps the two equal).
"""

from __future__ import annotations

from typing import Any

from dflashdoctor.report import Finding, Severity, Where

CODES: dict[str, tuple[Severity, str]] = {
    "not-compiled": ("error", "a plain function where a torch.compile wrapper was expected"),
    "dense-forward": ("error", "flex_attention forward ran the unfused dense kernel"),
    "dense-backward": ("error", "flex_attention backward ran the unfused dense kernel"),
    "recompile-limit-fallback": ("error", "dynamo hit its recompile limit and fell back to eager (dense)"),
    "dynamo-skip-fallback": ("error", "an exception inside a compiled frame made dynamo skip it for the process"),
    "recompiles": ("warning", "recompiles above budget (names the guard that failed)"),
    "graph-break": (
        "warning",
        "graph breaks in the compiled region: each site's line, dynamo's reason and its fix; known causes named",
    ),
    "framework-graph-break": (
        "info",
        "a graph break a framework makes on purpose (DDP's forward context, its bucketing): noted, nothing to fix",
    ),
    "score-matrix-materialized": ("error", "peak memory shows the full score matrix was built"),
    "numeric-mismatch": ("error", "compiled output disagrees with the reference beyond tolerance"),
    "backward-not-checked": ("info", "no backward check was possible (e.g. flex backward is unsupported on CPU)"),
    "target-raised": ("error", "the target raised an exception when called with valid inputs"),
    "kernel-out-of-resources": (
        "error",
        "a Triton kernel needs more shared memory (or another per-block resource) than this GPU has: "
        "names the kernel, the limit and the kernel_options that fit",
    ),
    "oom": ("error", "the run ran out of memory; evidence names the last attention calls and memory"),
    "env-hazard": ("warning", "a variable that is set makes training slow or silently uncompiled"),
    "requirement-unmet": (
        "warning",
        "an installed package of the training stack requires a version of another that is not the one installed",
    ),
    "package-metadata-unreadable": (
        "warning",
        "an installed package's metadata cannot be read (not UTF-8, or a read error): its version and "
        "requirements are unknown",
    ),
    "bytecode-not-cached": (
        "warning",
        "installed packages have no compiled bytecode and none is written: every process compiles them",
    ),
    "budget-exceeded": ("error", "the gate measured more than its configured budget allows"),
    "uncaught-exception": ("error", "a process of the run raised an exception nothing caught; names the module"),
    "instrumentation-unavailable": (
        "info",
        "a hook could not be installed on this torch version; the check it feeds is weaker",
    ),
    "bypasses-wrapper": ("error", "a flex_attention call does not go through the expected wrapper"),
    "hf-internal-flex-path": ("info", "calls go through transformers' own flex_attention integration"),
    "flex-unsupported-model": ("info", "the model class cannot use flex_attention; says what it uses instead"),
    "kernel-unavailable": (
        "warning",
        "this machine cannot run a kernel the model uses (FLA without a GPU, or a combination FLA refuses)",
    ),
    "repeat-kv-expansion": ("warning", "K/V are repeated to match query heads (memory multiplied)"),
    "autotuner-race": ("error", "concurrent use of a shared autotuner failed or corrupted state"),
    "autotuner-shared-state": ("warning", "the installed autotuner keeps per-call state on a shared instance"),
    "concurrent-autotuner-entry": ("error", "instrumentation saw two threads inside one autotuner at once"),
    "cache-corrupt-entry": ("error", "a cache entry is truncated, malformed, or inconsistent"),
    "cache-unreadable-entry": ("error", "a cache entry this user cannot read: triton or torch fails on it"),
    "cache-orphan-tmp": ("warning", "leftover temporary files or folders from an interrupted write"),
    "cache-shared-filesystem": ("warning", "the cache root is on a network or shared filesystem"),
    "cache-incomplete-entry": ("warning", "a key folder holds kernel files but no group file: an interrupted compile"),
    "cache-stale-entry": ("info", "cache entries written by another triton version, never read by this one"),
    "cache-relative-path": ("warning", "the cache root was given as a relative path"),
    "cache-shared-root": ("warning", "several ranks of one job are set up to write one cache root"),
    "cache-low-space": ("warning", "little free space left under the cache root"),
    "cache-not-writable": ("error", "the cache root cannot be written by this user"),
    "node-parts-mixed": ("error", "the parts merged are not one run: two for one node, or other nodes or commands"),
    "processes-left-running": ("error", "processes a command or probe started still ran after it exited: stopped"),
    "cache-root-untrusted": ("error", "the cache root is another user's, or others can write into it"),
    "cache-quarantined": ("info", "`cache fix` moved broken entries into a quarantine, with a manifest"),
    "cache-restored": ("info", "`cache restore` put a quarantine's entries back"),
    "cache-restore-incomplete": (
        "error",
        "after `cache restore` a moved entry is still out of place, or came back changed",
    ),
    "cache-quarantine-refused": (
        "error",
        "a quarantine or manifest not the user's own, writable by others, or naming paths outside its root and "
        "quarantine: nothing of it moved",
    ),
    "node-unreachable": (
        "error",
        "the gate could not run on one node (ssh failed, or its interpreter is missing); the others still report",
    ),
    "node-mismatch": (
        "error",
        "nodes differ in what matters (versions, driver, GPUs, cache filesystem, hazards, recompile limit), "
        "or a check fails on some nodes only; names the odd node out",
    ),
    "node-slow-steps": (
        "warning",
        "under the gate's `run`, one node's median optimizer step is far slower than the others' "
        "(in data-parallel training the slowest node sets every node's pace)",
    ),
    "node-missing": ("error", "a node's part of a run on several nodes never came, or never finished"),
    "node-part-damaged": (
        "error",
        "a node's part cannot be believed: another user's or reached through a link, or numbers no run has",
    ),
    "hang": ("error", "no progress within the hang timeout; evidence holds every thread's stack"),
    "log-flex-dense": ("error", "explain: the log shows flex_attention on its unfused dense path"),
    "log-autotuner-race": ("error", "explain: the log shows threads sharing one Triton/FLA autotuner"),
    "log-triton-cache": ("error", "explain: the log shows a corrupted or foreign Triton/Inductor cache entry loaded"),
    "log-recompile-limit": ("error", "explain: the log shows dynamo's recompile limit hit"),
    "log-out-of-resources": (
        "error",
        "explain: the log shows a Triton kernel needing more shared memory than the GPU has",
    ),
    "log-graph-break": ("error", "explain: the log shows a graph break or a fullgraph=True failure"),
    "log-fla-kernel": ("error", "explain: the log shows an FLA kernel failing to build or run"),
    "log-hf-flex-path": ("error", "explain: the log shows transformers' own flex_attention path failing"),
    "log-other-failure": ("error", "explain: the log shows a failure of another cause, said in words"),
    "log-cut-traceback": ("error", "explain: the log stops inside a traceback, before the error line naming its class"),
    "lint-raw-flex-call": ("error", "lint: flex_attention called outside any compiled region (its dense kernel)"),
    "lint-raw-flex-call-on-purpose": (
        "info",
        "lint (off unless selected): flex_attention called raw on purpose: a test, a benchmark, an eager "
        "reference, a compile switch's eager branch",
    ),
    "lint-wrapper-not-inductor": (
        "error",
        "lint: a flex_attention wrapper compiled with a backend other than Inductor",
    ),
    "lint-wrapper-rebound": (
        "error",
        "lint: a compiled flex_attention wrapper rebound to something else after it is made",
    ),
    "lint-mod-reads-global": ("warning", "lint: a score_mod/mask_mod reads a module-level number that is rebound"),
    "lint-wrapper-static-varying": (
        "warning",
        "lint: a flex_attention wrapper compiled with dynamic=False is called with lengths that vary",
    ),
    "lint-threaded-model-call": ("warning", "lint: a model, training step or Triton kernel run from a thread pool"),
    "run-timeout": ("error", "the gate's run was still going at run_timeout: stopped, every thread's stack kept"),
    "child-failed": ("error", "the command under `run` exited non-zero or died by a signal"),
    "run-interrupted": ("error", "dflashdoctor got Ctrl-C or SIGTERM and stopped the run before it ended (exit 3)"),
    "probe-crashed": ("error", "a probe crashed, hung or timed out (exit code 3)"),
}


def finding(
    code: str,
    title: str,
    *,
    detail: str = "",
    where: Where | None = None,
    evidence: dict[str, Any] | None = None,
    fix: str = "",
    refs: list[str] | None = None,
) -> Finding:
    severity, _meaning = CODES[code]
    return Finding(
        code=code,
        severity=severity,
        title=title,
        detail=detail,
        where=where,
        evidence=evidence or {},
        fix=fix,
        refs=refs or [],
    )


def codes_markdown() -> str:
    """docs/codes.md: the table above, for readers."""
    rows = "".join(f"| `{code}` | {severity} | {meaning} |\n" for code, (severity, meaning) in CODES.items())
    return (
        "# Finding codes\n\n"
        "Stable ids: tests, CI and users key on them, and none is ever renamed. A finding's severity is\n"
        "always the one below; `error` findings fail a report (exit 1), and `probe-crashed` and\n"
        "`run-interrupted` make it exit 3. Written from `dflashdoctor/codes.py` by\n"
        "`python3 -m dflashdoctor.codes > docs/codes.md`.\n\n"
        "| code | severity | meaning |\n|---|---|---|\n" + rows
    )


if __name__ == "__main__":
    print(codes_markdown(), end="")
