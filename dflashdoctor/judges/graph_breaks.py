"""What a graph break's reason means and what fixes it, said once for every judge.

Dynamo's reason is written for its developers: a first line naming the kind of break, then (torch
2.7 and later) `Explanation:` and `Hint:` lines and a link to its page about that break; older
releases give one terse line (`generic_jump TensorVariable()`). The reader needs the reason in plain
words and the change that removes the break, so each known kind carries its own fix, and one break
that every user-compiled HF model takes is recognised by its stack as a known hazard. A reason of a
kind not listed here keeps dynamo's own explanation and hints, which name the change for that kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PAGE = re.compile(r"https?://\S+/gb/gb\d+\.html")
_NOT_A_FIX = re.compile(r"report an issue|file an issue|PyTorch team", re.IGNORECASE)

_MASK_FLAG_FRAME = re.compile(r"torch/nn/attention/flex_attention\.py:\d+ in create_block_mask$")
HF_MASK_FLAG = "hf-create-block-mask-compile-flag"
MASK_FLAG = "create-block-mask-compile-flag"

FIX_HF_MASK_FLAG = (
    "Before the first compiled call, `torch._dynamo.config.ignore_logging_functions.add(warnings.warn)` "
    "(torch 2.13): dynamo then drops warnings.warn inside compiled code, and a tiny Llama compiled whole went "
    "from 8 breaks to 0 (transformers 5.24). Or compile the decoder layers instead of the whole model "
    "(`for layer in model.model.layers: layer.compile()`), which builds the mask outside the compiled region; "
    "or build the BlockMask yourself outside the compiled call and pass it as `attention_mask` (transformers "
    "uses a 4-D mask as given). `warnings.filterwarnings('ignore')` and "
    "`torch._dynamo.config.reorderable_logging_functions` do not remove the break."
)


@dataclass(frozen=True)
class BreakKind:
    """A kind of graph break, told by dynamo's reason text, with the change that removes it."""

    name: str
    pattern: re.Pattern[str]
    plain: str
    fix: str


KINDS = (
    BreakKind(
        "scalar",
        re.compile(r"Tensor\.item\(\)|capture_scalar_outputs"),
        "`.item()` turns a tensor into a Python number, which dynamo does not capture by default",
        "Keep the value a tensor: decide with torch operations (`torch.where`) instead of a Python `if` on "
        "`.item()`. If the number itself must reach Python code that dynamo can trace, set "
        "`torch._dynamo.config.capture_scalar_outputs = True`.",
    ),
    BreakKind(
        "branch",
        re.compile(r"^generic_jump|[Dd]ata[- ]dependent (branching|jump)"),
        "a Python `if` or `while` on a tensor's value (a data-dependent branch)",
        "Replace the branch with `torch.where` (or `torch.cond` for two code paths) so both sides stay in the "
        "graph, or make the decision outside the compiled function.",
    ),
    BreakKind(
        "print",
        re.compile(r"`print`|BuiltinVariable\(print\)"),
        "a print() call, which dynamo cannot put in a graph",
        "Remove the print from the compiled code (or guard it with `if not torch.compiler.is_compiling():`), "
        "or add `print` to `torch._dynamo.config.reorderable_logging_functions` so that dynamo prints after "
        "the graph instead of breaking it.",
    ),
    BreakKind(
        "warning",
        re.compile(r"`_?warnings\.warn`"),
        "a warnings.warn call, which dynamo cannot trace",
        "Move the warning out of the compiled code, or add `warnings.warn` to "
        "`torch._dynamo.config.ignore_logging_functions` (torch 2.13; dynamo then drops warnings inside "
        "compiled code).",
    ),
    BreakKind(
        "explicit",
        re.compile(r"torch\._dynamo\.graph_break\(\)"),
        "an explicit `torch._dynamo.graph_break()`",
        "Remove the `torch._dynamo.graph_break()` call if it was left from debugging.",
    ),
    BreakKind(
        "disabled",
        re.compile(r"torch\.compiler\.disable|torch\._dynamo\.disable"),
        "a call to a function wrapped in `torch.compiler.disable`, which always runs outside the graph",
        "Call the disabled function outside the compiled region, or remove the `torch.compiler.disable` "
        "if the function can be traced.",
    ),
)


@dataclass(frozen=True)
class BreakReading:
    """One graph break read for the user: its reason in plain words, the fix that reason calls
    for, and, for a known hazard, its name, the title that names it and what it costs."""

    plain: str
    fix: str
    page: str | None = None  # dynamo's page about this kind of break
    hazard: str | None = None
    title: str | None = None
    detail: str | None = None
    intentional: bool = False  # a framework's own deliberate break: a note, not a warning


# Dynamo's list of functions it must not trace holds torch.distributed's own: DDP's forward context
# (`_inside_ddp_forward`) breaks the graph on purpose, and DDPOptimizer splits it at bucket bounds.
_FRAMEWORK_BREAK = re.compile(
    r"intentionally marked that the function `[^`]*(DistributedDataParallel|FullyShardedDataParallel|"
    r"_inside_ddp_forward|torch\.distributed)[^`]*`|DDPOptimizer"
)


def kind_of(reason: str) -> BreakKind | None:
    return next((kind for kind in KINDS if kind.pattern.search(reason)), None)


def dynamo_words(reason: str) -> tuple[str, list[str]]:
    """Dynamo's explanation (or, where there is none, its first line) and the hints that are fixes."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    explained = [line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")]
    hints = [line.removeprefix("Hint:").strip() for line in lines if line.startswith("Hint:")]
    plain = explained[0] if explained else lines[0] if lines else "no reason recorded"
    return plain, [hint for hint in hints if not _NOT_A_FIX.search(hint)]


def _place(frame: str | None) -> str:
    return frame.replace("\\", "/") if frame else "an unrecorded frame"


def read_break(
    reason: str, site: str | None = None, stack: list[str] | None = None, entry: str | None = None
) -> BreakReading:
    """The reading of one reason, at one site with dynamo's user stack where they are known."""
    page_match = _PAGE.search(reason)
    page = page_match.group(0) if page_match else None
    kind = kind_of(reason)
    frames = [f.replace("\\", "/") for f in stack or []]
    framework = _FRAMEWORK_BREAK.search(reason)
    if framework is not None:
        return BreakReading(
            plain=f"torch.distributed's {framework.group(1) or 'DDPOptimizer'} breaks the graph on purpose "
            "(DDP runs its forward context and gradient buckets outside the graph)",
            fix="Nothing to change: the break is the framework's design; flex_attention inside each piece is "
            "still compiled (the call-site table says whether it ran fused).",
            page=page,
            intentional=True,
        )
    if kind is not None and kind.name == "warning" and any(_MASK_FLAG_FRAME.search(f) for f in frames):
        return _mask_flag(site, frames[-1], entry, page)
    if kind is not None:
        return BreakReading(plain=kind.plain, fix=kind.fix, page=page)
    plain, hints = dynamo_words(reason)
    fix = " ".join(hints) or "Move that line out of the compiled code, or write it with operations dynamo can trace."
    return BreakReading(plain=plain.rstrip("."), fix=fix, page=page)


def _mask_flag(site: str | None, broke_at: str, entry: str | None, page: str | None) -> BreakReading:
    """create_block_mask(..., _compile=True) inside a compiled region: torch's deprecation warning
    on that flag is a warnings.warn, which dynamo cannot trace. transformers' flex mask passes the
    flag, so any HF model compiled whole with attn_implementation="flex_attention" takes it."""
    torch_side = (
        f"torch deprecates that flag with `warnings.warn(..., DeprecationWarning)` ({_place(broke_at)}), and "
        "dynamo cannot trace warnings.warn, so the compiled region breaks there: once for each function on the "
        f"call chain from where dynamo began ({_place(entry)}) down to create_block_mask, as each resumed piece "
        "is compiled again, and again after every recompile. Every call then runs as separate graphs with the "
        "mask code between them in plain Python, and `fullgraph=True` raises instead. Filtering the warning "
        "does not help: dynamo breaks at the call whatever the filters say."
    )
    plain = "torch's deprecation warning for create_block_mask(_compile=True), which dynamo cannot trace"
    if site is not None and "/transformers/" in site.replace("\\", "/"):
        return BreakReading(
            plain=plain,
            fix=FIX_HF_MASK_FLAG,
            page=page,
            hazard=HF_MASK_FLAG,
            title="transformers builds its flex_attention mask with the deprecated create_block_mask(_compile=True)",
            detail=f"transformers' flex_attention mask ({_place(site)}) calls `create_block_mask(..., _compile=True)`. "
            + torch_side,
        )
    return BreakReading(
        plain=plain,
        fix=f"Drop `_compile=True` at {_place(site)}: inside a compiled region create_block_mask is compiled with "
        "the region, so the flag only adds the warning (2 breaks to 0 on torch 2.13). Outside one, call "
        "`torch.compile(create_block_mask)` as torch's warning says.",
        page=page,
        hazard=MASK_FLAG,
        title="create_block_mask(_compile=True) called inside the compiled region",
        detail=f"{_place(site)} calls `create_block_mask(..., _compile=True)`. " + torch_side,
    )
