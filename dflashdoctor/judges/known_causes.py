"""Exceptions whose message, and where it was raised, name a known cause in compiled, threaded
training: what each means and what fixes it, so an `uncaught-exception` says more than "read the
traceback". Each was seen in this project's runs (docs/known-hazards.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflashdoctor.judges.dense_cause import CauseKind


@dataclass(frozen=True)
class KnownCause:
    name: CauseKind
    message: re.Pattern[str]
    raised_in: tuple[str, ...]  # path fragments of the raising frame; empty: anywhere
    cause: str
    fix: str

    def matches(self, message: str, raised_at: str) -> bool:
        where = raised_at.replace("\\", "/")
        return bool(self.message.search(message)) and (not self.raised_in or any(p in where for p in self.raised_in))


KNOWN_CAUSES = (
    KnownCause(
        "flex-cpu-backward",
        re.compile(r"FlexAttention does not support backward on CPU"),
        (),
        "flex_attention has no backward on the CPU in this torch: a training step (inputs that require grad) "
        "raises at the first flex call, compiled or not.",
        "Run the training step on a GPU, or check the CPU part forward only (`with torch.no_grad():`, or "
        "`trainer.evaluate()` instead of `trainer.train()`).",
    ),
    KnownCause(
        "fx-tracing-flag",
        re.compile(r"Detected that you are using FX to symbolically trace a dynamo-optimized function"),
        (),
        "torch keeps FX tracing in one process-global flag (torch.fx._symbolic_trace._is_fx_tracing_flag): "
        "while another thread traces (dynamo compiling a frame, torch.fx.symbolic_trace, or an eager "
        "flex_attention call, which sets and restores the flag around its own torch.compile), a call into "
        "a compiled function on this thread sees the flag set and raises.",
        "Compile from one thread: run each model's first step, and every step that recompiles, one thread "
        "at a time before the threads run together; or give each data-parallel pair its own process.",
    ),
    KnownCause(
        "shared-autotuner",
        re.compile(r"'NoneType' object is not (a mapping|subscriptable|iterable)"),
        ("triton/runtime/autotuner.py", "fla/ops/utils/cache.py"),
        "two threads ran one triton Autotuner at once: its run() keeps per-call state (the arguments, the "
        "timings, the best config) on the shared object, and one thread's reset empties what the other "
        "reads (`dflashdoctor race` reproduces it).",
        "Let one thread at a time call the autotuned kernels (a lock around the target forwards), or warm "
        "every autotuner in one thread before the threads start, or run one process per pair.",
    ),
)


def known_cause(message: str, raised_at: str | None) -> KnownCause | None:
    return next((c for c in KNOWN_CAUSES if c.matches(message, raised_at or "")), None)
