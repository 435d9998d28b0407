"""The failure classes `explain` tells apart, each by the evidence a log shows for it: the lines it
prints (signals) and the frames it passes through. One class is the failure's: the first in
`ORDER` whose evidence is there (a kernel that does not fit outranks the compile error that wraps
it; a shared autotuner outranks the model code it crashed in). A log with an exception and none of
these is `other`, said with what it does show (a batch-size OOM, an NCCL timeout, a KeyError).

Each class names the command that confirms it on the user's pipeline and the fix, worded as the
probes word it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflashdoctor.cache.layout import cache_root_of, written_by_a_cache
from dflashdoctor.explain.call_path import owner
from dflashdoctor.explain.reader import Reading, Traceback


@dataclass(frozen=True)
class FailureClass:
    code: str
    name: str
    confirm: str  # the command, with {module}, {wrapper}, {script} filled where the log names them
    fix: str


CLASSES = {
    "flex-dense": FailureClass(
        "log-flex-dense",
        "flex_attention ran its unfused dense path (the full score matrix)",
        "dflashdoctor trace-attention --script {script}",
        "Call flex_attention through a wrapper compiled once with `torch.compile(flex_attention)` (Inductor), "
        "or compile the module that calls it; trace-attention names the call site that ran dense.",
    ),
    "autotuner-race": FailureClass(
        "log-autotuner-race",
        "threads share one Triton/FLA autotuner (its per-call state, `nargs`, overwritten)",
        "dflashdoctor race --threads 2",
        "Run the data-parallel replicas in processes (torchrun/DDP, not nn.DataParallel or a thread pool), or "
        "hold one lock around the autotuned call (`with dflashdoctor.hooks.AutotunerGuard(serialize=True):`).",
    ),
    "triton-cache": FailureClass(
        "log-triton-cache",
        "a corrupted or foreign Triton/Inductor cache entry was loaded",
        "dflashdoctor cache check{cache}",
        "Quarantine the broken entries (`dflashdoctor cache fix`) or give each node and GPU architecture its "
        "own TRITON_CACHE_DIR/TORCHINDUCTOR_CACHE_DIR.",
    ),
    "recompile-limit": FailureClass(
        "log-recompile-limit",
        "dynamo hit its recompile limit (past it the frame runs eagerly: flex_attention dense)",
        "dflashdoctor check-compile {target} --vary 8",
        "Find the guard that changes (the log's recompile reason): mark the length dynamic "
        "(`torch._dynamo.mark_dynamic`), pass a changing number as a tensor, or pad to a few sizes.",
    ),
    "out-of-resources": FailureClass(
        "log-out-of-resources",
        "a Triton kernel needs more shared memory than this GPU has",
        "dflashdoctor check-compile {target} --device cuda",
        "Pass `kernel_options` with smaller blocks or fewer stages (BLOCK_M/BLOCK_N, num_stages) to "
        "flex_attention, or a smaller head dim; check-compile names the options that fit.",
    ),
    "graph-break": FailureClass(
        "log-graph-break",
        "dynamo could not trace the region (a graph break; with fullgraph=True, an error)",
        "dflashdoctor check-compile {target}",
        "Move the unsupported call out of the compiled region or compile the parts around it; the log's "
        "reason names what dynamo could not trace.",
    ),
    "fla-kernel": FailureClass(
        "log-fla-kernel",
        "an FLA (flash-linear-attention) kernel failed to build or run",
        "dflashdoctor versions",
        "Install the triton, torch and CUDA versions FLA asks for (`dflashdoctor versions` shows the ones "
        "installed against what each package requires), on a GPU triton supports.",
    ),
    "hf-flex-path": FailureClass(
        "log-hf-flex-path",
        "transformers' own flex_attention path failed",
        "dflashdoctor trace-attention --script {script}",
        "Pass what transformers' flex path expects (a BlockMask it made, a supported device and dtype), or use "
        "another attn_implementation; trace-attention shows which layers call it.",
    ),
}
CUT = FailureClass(
    "log-cut-traceback",
    "the log stops inside a traceback, before its error line",
    "",
    "The error line follows the last frame: give explain the log up to its end (all ranks' files), or "
    "keep the output of the next run (`dflashdoctor run -- CMD` records each uncaught exception whole).",
)
OTHER = FailureClass(
    "log-other-failure",
    "a failure outside flex_attention, dynamo, Triton and FLA",
    "",
    "Not one of the compiled-attention failures dflashdoctor knows; the exception below is the log's own.",
)

# class -> what its lines say (searched on every line)
SIGNALS = {
    "flex-dense": re.compile(
        r"flex_attention called without torch\.compile|unfused implementation that materializes|"
        r"\bsdpa_dense(_backward)?\b|\bmath_attention\b|_math_attention_inner|"
        r"(?:flex_attention|flex).{0,80}(?:fall(?:s|ing)? back|dispatched) to (?:the )?(?:uncompiled )?eager"
    ),
    "autotuner-race": re.compile(r"\bnargs\b|CachedAutotuner|Caught \w+ in replica \d+"),
    "triton-cache": re.compile(
        r"device kernel image is invalid|no kernel image is available|JSONDecodeError|UnpicklingError|"
        r"codecache|autotune_cache|triton/runtime/cache\.py|\.cubin|cache_dir|FileNotFoundError.*torchinductor"
    ),
    "recompile-limit": re.compile(
        r"cache_size_limit|recompile_limit|FailOnRecompileLimitHit|hit config\.\w*limit|"
        r"torch\._dynamo hit config|hit recompilation cache limit"
    ),
    "out-of-resources": re.compile(r"OutOfResources|out of resource:|Hardware limit:?\s*\d+"),
    "graph-break": re.compile(
        r"torch\._dynamo\.exc\.Unsupported|\bUnsupported: |Graph break|graph_break|fullgraph=True"
    ),
    "fla-kernel": re.compile(r"[/\\]fla[/\\]|\bfla\.(?:ops|modules|layers)\b|0 active drivers"),
    "hf-flex-path": re.compile(
        r"transformers[/\\]integrations[/\\]flex_attention\.py|compile_friendly_flex_attention|WrappedFlexAttention|"
        r"'BlockMask' object|BlockMask'\)?$|and 'BlockMask'"
    ),
    "oom": re.compile(r"CUDA out of memory|OutOfMemoryError|[Tt]ried to allocate|can't allocate memory"),
    "nccl": re.compile(r"NCCL|Watchdog caught collective operation timeout|ProcessGroupNCCL"),
    "nan": re.compile(r"\bnan\b|\bNaN\b|non-finite"),
    "flex-used": re.compile(r"flex_attention|backend '?flex'?|attn_implementation\W+flex|BlockMask"),
    "run-failed": re.compile(r"ChildFailedError|failed \(exitcode: -?[1-9]|stopping training|Watchdog caught"),
}

# lowercase words, one of which is in every line a signal above matches (the reader's prefilter)
NEEDLES = (
    "flex", "sdpa_dense", "math_attention", "unfused", "nargs", "autotuner", "replica", "kernel image",
    "jsondecode", "unpickling", "cache", "cubin", "limit", "failonrecompile", "outofresources",
    "out of resource", "unsupported", "graph break", "graph_break", "fullgraph", "fla", "0 active drivers",
    "blockmask", "out of memory", "outofmemory", "tried to allocate", "allocate memory", "nccl", "watchdog",
    "nan", "non-finite", "childfailed", "exitcode", "stopping training",
)  # fmt: skip

# the classes, most specific first: the first with evidence is the failure's
ORDER = (
    "out-of-resources",
    "autotuner-race",
    "triton-cache",
    "fla-kernel",
    "recompile-limit",
    "hf-flex-path",
    "flex-dense",
    "graph-break",
)


def _evidence(reading: Reading, name: str) -> bool:
    """Whether the log shows the class: its signal lines, checked against what else must hold."""
    if name == "triton-cache" and _generated_file_failed(reading):
        return True
    if not reading.signals.get(name):
        return False
    said = " ".join(text for _, text in reading.signals[name])
    if name == "autotuner-race":  # `nargs` is the race only where an autotuner is on the failing path
        on_path = "CachedAutotuner" in said or "replica" in said or _frames_in(reading, "autotuner")
        return on_path or ("nargs" in said and _exception_matches(reading, r"NoneType"))
    if name == "triton-cache":  # a cache path alone is not a corrupt entry: a load must have failed
        return bool(
            re.search(r"kernel image|JSONDecodeError|UnpicklingError|FileNotFoundError|No such file", said)
        ) or (
            _exception_matches(reading, r"JSONDecodeError|UnpicklingError|EOFError|FileNotFoundError")
            and (_frames_in(reading, "codecache") or _frames_in(reading, "runtime/cache") or "cache" in said)
        )
    if name == "fla-kernel":  # FLA's frames with a kernel's error, or an FLA op where the failure is
        return (
            "0 active drivers" in said
            or bool(re.search(r"error|Error|kernel image|loc\(", said))
            or (_innermost_library_frame(reading, "fla/ops/"))
        )
    if name == "graph-break":
        return "Unsupported" in said or "Graph break" in said or "graph_break" in said
    return True


_FILE_NAMED = re.compile(r"[^\s\"()<>,]+\.(?:py|so|cubin|hsaco|json|ptx|cpp)\b")


def damaged_cache_root(reading: Reading) -> tuple[str, str] | None:
    """The kind and root of the cache whose written file an error names, where it names one whole."""
    for _, _, text in reading.exceptions:
        for named in _FILE_NAMED.findall(text):
            root = cache_root_of(named.lstrip("'`"))
            if root is not None:
                return root
    return None


def _generated_file_failed(reading: Reading) -> bool:
    """An error that names a file of a cache's own layout (Inductor's `<shard>/<key>.py`, a Triton key
    folder's file) that would not load: Inductor wrote it whole, so a load that fails is damage."""
    return any(
        re.search(r"Failed to import|SyntaxError|ImportError|invalid ELF|file too short|JSONDecodeError", text)
        and any(written_by_a_cache(named.lstrip("'`")) for named in _FILE_NAMED.findall(text))
        for _, _, text in reading.exceptions
    )


def _innermost_library_frame(reading: Reading, word: str) -> bool:
    """The failing traceback's innermost frame outside torch is in `word`'s code."""
    failing = failing_traceback(reading)
    outside = [f for f in failing.frames if owner(f) not in ("torch", "tool")] if failing else []
    return bool(outside) and word in outside[-1].path.replace("\\", "/")


def _frames_in(reading: Reading, word: str) -> bool:
    return any(word in frame.path for traceback in reading.tracebacks for frame in traceback.frames)


def _exception_matches(reading: Reading, pattern: str) -> bool:
    return any(re.search(pattern, text) for _, _, text in reading.exceptions)


def failure_class(reading: Reading) -> FailureClass | None:
    """The failure's class, `OTHER` for an exception none explains, `CUT` for frames whose error line
    the log does not hold, None when the log shows no failure."""
    for name in ORDER:
        if _evidence(reading, name):
            return CLASSES[name]
    flex = reading.signals.get("flex-used")
    if flex and reading.signals.get("oom"):  # out of memory in a run on flex's path: its dense matrix
        return CLASSES["flex-dense"]
    if flex and _frames_in(reading, "transformers/") and _exception_matches(reading, r"flex|BlockMask|return_lse"):
        return CLASSES["hf-flex-path"]
    if not reading.exceptions and any(t.frames for t in reading.tracebacks):
        return CUT
    if reading.exceptions or any(reading.signals.get(n) for n in ("oom", "nccl", "run-failed")):
        return OTHER
    return None


_ALLOCATION = re.compile(r"[Tt]ried to allocate (?:(\d+(?:\.\d+)?) ([KMGT]i?B)|(\d+) bytes)")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def allocation_bytes(reading: Reading) -> float | None:
    """The size the out-of-memory error says was asked for (the CUDA and the CPU allocator's words)."""
    for _, _, text in reading.exceptions:
        match = _ALLOCATION.search(text)
        if match is not None:
            return float(match.group(3)) if match.group(3) else float(match.group(1)) * _UNITS[match.group(2)]
    return None


def other_cause(reading: Reading) -> str:
    """What a log with another cause shows, in words."""
    if reading.signals.get("oom"):
        return "memory ran out outside attention's dense path (a batch or model too large for the device)"
    if reading.signals.get("nccl"):
        return "a collective timed out or failed in NCCL (a rank stalled, died or diverged)"
    if _exception_matches(reading, r"state_dict|Missing key|Unexpected key"):
        return "a checkpoint that does not match the model (missing or unexpected keys)"
    if _exception_matches(reading, r"BackendCompilerFailed|CppCompileError|InductorError|CompilationError"):
        return "the compiler backend failed to build the graph (the log's error names the stage and the file)"
    if _exception_matches(reading, r"\bKeyError\b"):
        return "a KeyError (a configuration, checkpoint or data key that is not there)"
    if reading.signals.get("nan"):
        return "the loss or a tensor became NaN or infinite"
    return "an exception none of the compiled-attention failures explains"


def failing_traceback(reading: Reading) -> Traceback | None:
    """The failure's traceback: the first with frames on the first rank that failed (the last one
    when ranks are not told apart: the run's final error)."""
    with_frames = [t for t in reading.tracebacks if t.frames]
    if not with_frames:
        return None
    if reading.failed_ranks:
        first = reading.ranks_first_failure_first()[0]
        ranked = [t for t in with_frames if t.rank == first]
        if ranked:
            return ranked[0]
    return with_frames[-1]
