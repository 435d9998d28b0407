"""Proves the fix on the user's own call: one recorded dense flex_attention call of each dense site,
replayed after the traced run through a fresh `torch.compile(flex_attention)` (Inductor).

The dense-kernel hook hands over the higher-order op's arguments of each site's first dense forward
(`DenseFlexRecorder.capture`). Kept: the shapes, strides, dtypes and devices of q, k and v (not the
tensors: the replay makes fresh random ones), and references to the score_mod, the block mask's
tuple and the tensors both mods close over. After the traced run each site's call runs twice on the
same fresh inputs: the dense kernel as the user's run called it (the op itself, with the mods dynamo
traced), then flex_attention compiled by Inductor, with a callable score_mod and mask_mod rebuilt
from those graphs and their buffers and a BlockMask rebuilt from its tuple. The compiled call is
proven fused only when it ran to the end and no dense kernel fired during it; the outputs (and on
CUDA the gradients of q, k and v) are compared, and on CUDA each run's peak memory over what was
allocated before it is measured. On the CPU the replay is forward only: flex_attention has no CPU
backward. Sites whose calls have the same shapes and mods share one replay.

Everything that goes wrong becomes a reason ("fix not proven: ..."), never an error of the probe;
the replay runs on a thread of its own, waited for at most the time left of its budget.

Probed side: standard library and torch only.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
import types
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dflashdoctor.hooks.dynamo_skip import skip_tree
from dflashdoctor.observations import DenseEvent
from dflashdoctor.records import FIX_REPLAY_PHASE, SourceSite
from dflashdoctor.redaction import redact_text

if TYPE_CHECKING:
    from dflashdoctor.hooks.flex_dense import DenseFlexRecorder

_HOP_ARGS = (
    *("query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options"),
    *("score_mod_other_buffers", "mask_mod_other_buffers"),
)
BUDGET_S = 240.0  # all replays of one probe together; the one running past it is left behind
MAX_REPLAYS = 4  # distinct calls (shapes and mods) replayed; each compiles flex_attention once
CPU_SCORE_BYTES = 1 << 30  # a dense call whose float32 scores pass this is too slow to replay on a CPU
_RELATIVE_TOLERANCE = 0.05  # of the dense output's largest magnitude: a fused result further off is no fix
_NOT_BLOCK_MASK_FIELDS = ("self", "seq_lengths", "BLOCK_SIZE", "mask_mod")
_THREAD = "dflashdoctor-fix-replay"


class NotReplayable(Exception):
    """The call cannot be replayed; the message is the reason, said to the user."""


@dataclass(frozen=True)
class TensorSpec:
    """What a replay needs of one of q, k, v: never the tensor itself."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any
    device: Any
    requires_grad: bool

    @classmethod
    def of(cls, tensor: Any) -> TensorSpec:
        return cls(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device, bool(tensor.requires_grad))

    def fresh(self, generator: Any, requires_grad: bool) -> Any:
        """Random values with this shape, strides, dtype and device (a view of a flat tensor large
        enough for the strides, so an expanded or permuted layout is kept as it was)."""
        import torch

        extent = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True) if n > 0)
        flat = torch.randn(extent, generator=generator, device=self.device, dtype=torch.float32).to(self.dtype)
        return flat.as_strided(self.shape, self.stride).detach().requires_grad_(requires_grad)


@dataclass
class CapturedCall:
    """The first dense forward call of one site, as the dense kernel received it."""

    event: DenseEvent
    tensors: tuple[TensorSpec, TensorSpec, TensorSpec] | None = None
    score_mod: Any = None
    block_mask: tuple[Any, ...] = ()
    scale: Any = None
    kernel_options: dict[str, Any] = field(default_factory=dict)
    score_buffers: tuple[Any, ...] = ()
    mask_buffers: tuple[Any, ...] = ()
    problem: str | None = None  # why it cannot be replayed, seen when it was captured
    backward: bool = False  # its site's backward ran dense too: replayed forward and backward (CUDA)

    @property
    def name(self) -> str:
        site = self.event.forward_site or self.event.site
        return self.event.layer or (f"{site.get('file')}:{site.get('line')}" if site else "an unnamed site")


@dataclass
class ReplayOutcome:
    """One site's replay (records.FixReplayRecord)."""

    site: SourceSite | None
    forward_site: SourceSite | None
    layer: str | None
    stack: list[str]
    device: str
    proven: bool = False
    reason: str | None = None
    backward: bool = False
    dense_kernels: int | None = None  # dense kernels the compiled calls ran, forward and backward
    dense_peak_bytes: int | None = None
    fused_peak_bytes: int | None = None
    dense_out_of_memory: bool = False
    max_abs_diff: float | None = None
    seconds: float | None = None
    replayed_as: str | None = None

    @classmethod
    def of(cls, call: CapturedCall) -> ReplayOutcome:
        event = call.event
        return cls(
            site=event.site,
            forward_site=event.forward_site,
            layer=event.layer,
            stack=list(event.stack),
            device=event.device,
            backward=call.backward,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _site_key(event: DenseEvent) -> tuple[Any, ...]:
    site = event.site
    if not site:
        return (None, None, event.layer)
    return (site.get("file"), site.get("line"), event.layer)


class FixReplay:
    """Captures each site's first dense forward while it is entered; `replay()` afterwards."""

    def __init__(self, recorder: DenseFlexRecorder) -> None:
        self.recorder = recorder
        self.calls: dict[tuple[Any, ...], CapturedCall] = {}
        self._left_running = False  # a replay past its time, still running on its thread

    def __enter__(self) -> FixReplay:
        self.recorder.capture = self._capture
        return self

    def __exit__(self, *exc: object) -> None:
        if self.recorder.capture == self._capture:
            self.recorder.capture = None

    def _capture(self, event: DenseEvent, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Called by the dense kernel before it runs: one dict lookup for every call after a site's first."""
        key = _site_key(event)
        if key in self.calls or event.phase == FIX_REPLAY_PHASE:
            return
        try:
            self.calls[key] = _captured(event, args, kwargs)
        except Exception as exc:  # never the user's kernel's problem
            self.calls[key] = CapturedCall(event, problem=f"its arguments could not be read ({_said(exc)})")

    def replay(self, budget_s: float = BUDGET_S, max_replays: int = MAX_REPLAYS) -> list[dict[str, Any]]:
        """One record per captured site, in the order the sites first ran dense."""
        self.__exit__()
        recorder = self.recorder
        saved = recorder.phase, recorder.measure_memory
        # the recorder's own per-kernel peak resets would cut the replay's peaks short
        recorder.phase, recorder.measure_memory = FIX_REPLAY_PHASE, False
        self._left_running = False
        try:
            return self._replay_all(budget_s, max_replays)
        finally:
            if not self._left_running:  # else its later kernels must still say they are the replay's
                recorder.phase, recorder.measure_memory = saved

    def _replay_all(self, budget_s: float, max_replays: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + budget_s
        backward = [e for e in self.recorder.events if e.kind == "backward" and e.phase != FIX_REPLAY_PHASE]
        done: dict[Hashable, tuple[ReplayOutcome, str]] = {}
        stopped: str | None = None
        records = []
        for call in self.calls.values():
            outcome = ReplayOutcome.of(call)
            signature: Hashable
            try:
                call.backward = _ran_backward(call.event, backward) and call.tensors is not None
                outcome.backward = call.backward
                signature = _signature(call)
            except Exception:  # a call that cannot be compared with others is replayed on its own
                signature = id(call)
            if call.problem is not None:
                outcome.reason = call.problem
            elif signature in done:
                first, name = done[signature]
                shared = {k: v for k, v in asdict(first).items() if k not in ("site", "forward_site", "layer", "stack")}
                outcome = ReplayOutcome(**{**asdict(outcome), **shared, "replayed_as": first.replayed_as or name})
            elif stopped is not None:
                outcome.reason = stopped
            elif len(done) >= max_replays:
                outcome.reason = f"not replayed: {max_replays} other calls were replayed first (the most per trace)"
            else:
                stopped = self._replay_in_thread(call, outcome, deadline, budget_s)
                done[signature] = (outcome, call.name)
            records.append(outcome.to_dict())
        return records

    def _replay_in_thread(
        self, call: CapturedCall, outcome: ReplayOutcome, deadline: float, budget_s: float
    ) -> str | None:
        """Runs one replay, waiting at most until `deadline`; the reason every later replay is
        skipped for, when this one ran out of time."""
        left = deadline - time.monotonic()
        if left <= 0:
            outcome.reason = f"not replayed: the replays' {budget_s:.0f} s were spent"
            return outcome.reason
        box: dict[str, Any] = {}
        working = replace(outcome)  # a replay left running past its time keeps writing to its own copy

        def work() -> None:
            try:
                _replay(call, working, self.recorder)
            except BaseException as exc:  # any failure is a reason; the probe goes on
                box["error"] = exc

        thread = threading.Thread(target=work, name=_THREAD, daemon=True)  # noqa: DFD006 (one replay at a time)
        started = time.monotonic()
        thread.start()
        thread.join(left)
        if thread.is_alive():  # left running: the probe writes its result and exits without it
            self._left_running = True
            outcome.proven, outcome.reason = False, f"replay timed out after {time.monotonic() - started:.0f} s"
            return f"not replayed: an earlier replay ran past the replays' {budget_s:.0f} s"
        outcome.__dict__.update(working.__dict__)
        error = box.get("error")
        if isinstance(error, NotReplayable):
            outcome.proven, outcome.reason = False, str(error)
        elif error is not None:
            outcome.proven, outcome.reason = False, f"the replay failed: {_said(error)}"
        outcome.seconds = round(time.monotonic() - started, 2)
        return None


def _first_line(text: str, limit: int = 300) -> str:
    lines = str(text).strip().splitlines()
    return redact_text(lines[0] if lines else "")[:limit]


def _said(exc: BaseException) -> str:
    first = _first_line(str(exc))
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _captured(event: DenseEvent, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CapturedCall:
    import torch

    values = {
        "score_mod_other_buffers": (),
        "mask_mod_other_buffers": (),
        **dict(zip(_HOP_ARGS, args, strict=False)),
        **kwargs,
    }
    query, key, value = values["query"], values["key"], values["value"]
    call = CapturedCall(
        event,
        score_mod=values["score_mod"],
        block_mask=tuple(values["block_mask"]),
        scale=values["scale"],
        kernel_options=dict(values["kernel_options"] or {}),
        score_buffers=tuple(values["score_mod_other_buffers"]),
        mask_buffers=tuple(values["mask_mod_other_buffers"]),
    )
    plain = (torch.Tensor, torch.nn.Parameter)
    odd = next((type(t).__name__ for t in (query, key, value) if type(t) not in plain), None)
    if odd is not None:
        call.problem = f"its inputs are {odd}, not plain tensors"
    elif not all(t.dtype.is_floating_point for t in (query, key, value)):
        call.problem = f"its inputs are {query.dtype}, not floating point"
    else:
        call.tensors = (TensorSpec.of(query), TensorSpec.of(key), TensorSpec.of(value))
    return call


def _ran_backward(event: DenseEvent, backward: list[DenseEvent]) -> bool:
    """The site's backward ran (dense, as a dense forward's always does): replayed with it on CUDA."""
    for other in backward:
        if event.forward_site and other.forward_site == event.forward_site:
            return True
        if (event.site or event.layer) and (other.site, other.layer) == (event.site, event.layer):
            return True
    return False


def _signature(call: CapturedCall) -> tuple[Any, ...]:
    """Calls alike in everything the compiled kernel depends on (buffer values aside) share a replay."""
    import torch

    def part(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), value.dtype, str(value.device))
        if isinstance(value, torch.fx.GraphModule):
            return value.code
        return value if isinstance(value, int | float | str | bool | type(None)) else id(value)

    return (
        call.tensors,
        call.backward,
        part(call.score_mod),
        tuple(part(p) for p in call.score_buffers),
        tuple(part(p) for p in call.block_mask),
        tuple(part(p) for p in call.mask_buffers),
        call.scale,
        repr(sorted(call.kernel_options.items())),
    )


def _bound_score_mod(mod: Any, buffers: tuple[Any, ...]) -> Callable[..., Any]:
    """The op's score_mod takes the tensors it closes over after its five arguments; flex_attention's
    takes five (it reads the arity)."""

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return mod(score, b, h, q_idx, kv_idx, *buffers)

    return score_mod


def _bound_mask_mod(mod: Any, buffers: tuple[Any, ...]) -> Callable[..., Any]:
    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return mod(b, h, q_idx, kv_idx, *buffers)

    return mask_mod


def block_mask_of(parts: tuple[Any, ...], mask_mod: Callable[..., Any]) -> Any:
    """The BlockMask whose `as_tuple()` the op received: its two lengths, its tensors in the order its
    constructor names them, its two block sizes and its mask_mod. Checked by taking it apart again."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    names = [n for n in inspect.signature(BlockMask.__init__).parameters if n not in _NOT_BLOCK_MASK_FIELDS]
    middle = parts[2:-3]
    if len(parts) < 5 or len(middle) != len(names):
        raise NotReplayable(f"this torch's block mask tuple has {len(parts)} parts, not the {len(names) + 5} expected")
    mask = BlockMask(
        seq_lengths=(parts[0], parts[1]),
        BLOCK_SIZE=(parts[-3], parts[-2]),
        mask_mod=mask_mod,
        **dict(zip(names, middle, strict=True)),
    )
    again = mask.as_tuple()
    same = len(again) == len(parts) and all(
        a is b or (not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b)
        for a, b in zip(again[:-1], parts[:-1], strict=True)
    )
    if not same:
        raise NotReplayable("the block mask rebuilt from the call's tuple does not take apart into the same tuple")
    return mask


def _elsewhere(call: CapturedCall, device: Any) -> str | None:
    """A tensor a mod closes over (or the mask's own) on another device than q."""
    import torch

    named = [("the score_mod", t) for t in call.score_buffers] + [("the mask_mod", t) for t in call.mask_buffers]
    named += [("the block mask", t) for t in call.block_mask]
    for owner, tensor in named:
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 0 and tensor.device != device:
            return f"{owner} closes over a tensor on {tensor.device} while the call ran on {device}"
    return None


def _dynamo_disabled() -> bool:
    import torch

    return bool(getattr(torch._dynamo.config, "disable", False)) or os.environ.get("TORCHDYNAMO_DISABLE") == "1"


def _fresh_flex_entry() -> Callable[..., Any]:
    """flex_attention behind a code object of its own: dynamo keys its cache and recompile count by
    code, so what the user's own compiled wrappers left there (a recompile limit hit) is not ours."""
    from torch.nn.attention.flex_attention import flex_attention

    def replayed_flex(query: Any, key: Any, value: Any, score_mod: Any, block_mask: Any, **options: Any) -> Any:
        return flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, **options)  # noqa: DFD001 (compiled by the replay, through a fresh code object)

    code = replayed_flex.__code__.replace()
    return types.FunctionType(code, replayed_flex.__globals__, "replayed_flex", None, replayed_flex.__closure__)


def _public_options(options: dict[str, Any]) -> dict[str, Any]:
    """The kernel options a user may pass (the op's carry flex_attention's own, which it refuses)."""
    from torch.nn.attention import flex_attention as module

    allowed = getattr(module, "FlexKernelOptions", None)
    keys = set(getattr(allowed, "__required_keys__", ())) | set(getattr(allowed, "__optional_keys__", ()))
    kept = {k: v for k, v in options.items() if k in keys} if keys else {}
    if kept.get("FORCE_USE_FLEX_ATTENTION"):
        kept.pop("BACKEND", None)  # set by flex_attention itself; the two together are refused
    return kept


def _replay(call: CapturedCall, outcome: ReplayOutcome, recorder: DenseFlexRecorder) -> None:
    """The call dense, then compiled; the outcome filled in as far as it got."""
    import torch

    assert call.tensors is not None
    device = call.tensors[0].device
    cuda = device.type == "cuda"
    if _dynamo_disabled():
        raise NotReplayable("dynamo is disabled in this process (TORCHDYNAMO_DISABLE or torch._dynamo.config.disable)")
    elsewhere = _elsewhere(call, device)
    if elsewhere:
        raise NotReplayable(elsewhere)
    if not cuda and call.event.score_matrix_bytes > CPU_SCORE_BYTES:
        scores = call.event.score_matrix_bytes / 2**30
        raise NotReplayable(f"too large to replay on the CPU (a {scores:.3g} GiB score matrix per dense call)")
    score_mod = _bound_score_mod(call.score_mod, call.score_buffers)
    mask = block_mask_of(call.block_mask, _bound_mask_mod(call.block_mask[-1], call.mask_buffers))
    generator = torch.Generator(device=device).manual_seed(0)
    backward = outcome.backward = call.backward and cuda and any(spec.requires_grad for spec in call.tensors)
    inputs = [spec.fresh(generator, backward and spec.requires_grad) for spec in call.tensors]
    broke: list[str] = []
    with torch.cuda.device(device) if cuda else contextlib.nullcontext():
        dense = _dense_run(call, inputs, backward, cuda, outcome, generator)
        fused = _fused_run(call, inputs, score_mod, mask, backward, cuda, outcome, recorder, dense, broke)
    if outcome.dense_kernels:
        calls = f"{outcome.dense_kernels} call{'s' if outcome.dense_kernels != 1 else ''}"
        outcome.reason = f"torch.compile(flex_attention) still ran the dense kernel ({calls})" + (
            f": dynamo broke the graph ({broke[0]})" if broke else ""
        )
        return
    if dense is not None:
        outcome.max_abs_diff, off = _difference(dense, fused)
        if off:
            outcome.reason = f"the fused result differs from the dense one by {outcome.max_abs_diff:.3g} at most"
            return
    outcome.proven = True


def _graph_breaks() -> dict[str, int]:
    """dynamo's graph-break count by reason, this process's whole (empty where this torch keeps none)."""
    try:
        from torch._dynamo.utils import counters

        return dict(counters["graph_break"])
    except Exception:
        return {}


def _peak_start(cuda: bool) -> int:
    import torch

    if not cuda:
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _peak_since(cuda: bool, base: int) -> int | None:
    import torch

    if not cuda:
        return None
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - base)


def _grads(inputs: list[Any]) -> list[Any]:
    grads = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    return grads


def _dense_run(
    call: CapturedCall, inputs: list[Any], backward: bool, cuda: bool, outcome: ReplayOutcome, generator: Any
) -> tuple[Any, list[Any], Any] | None:
    """The op itself, as the user's run called it: its dense kernel. (output, grads, grad_out), or
    None when it ran out of memory (as in the user's run, it may well have)."""
    import torch
    from torch._higher_order_ops.flex_attention import flex_attention as flex_op

    base = _peak_start(cuda)
    try:
        query, key, value = inputs  # the three of call.tensors
        with torch.set_grad_enabled(backward):
            out = flex_op(
                query,
                key,
                value,
                call.score_mod,
                call.block_mask,
                call.scale,
                call.kernel_options,
                call.score_buffers,
                call.mask_buffers,
            )[0]
            grad_out = None
            if backward:
                grad_out = torch.randn(out.shape, generator=generator, device=out.device).to(out.dtype)
                out.backward(grad_out)
    except torch.OutOfMemoryError:
        outcome.dense_out_of_memory = True
        torch.cuda.empty_cache()
        return None
    except Exception as exc:
        raise NotReplayable(f"the dense call raised on replay: {_said(exc)}") from exc
    outcome.dense_peak_bytes = _peak_since(cuda, base)
    return out.detach(), _grads(inputs), grad_out


def _fused_run(
    call: CapturedCall,
    inputs: list[Any],
    score_mod: Callable[..., Any],
    mask: Any,
    backward: bool,
    cuda: bool,
    outcome: ReplayOutcome,
    recorder: DenseFlexRecorder,
    dense: tuple[Any, list[Any], Any] | None,
    broke: list[str],
) -> tuple[Any, list[Any]]:
    """torch.compile(flex_attention), default backend, dense kernels counted while it runs. On CUDA a
    first call compiles (and autotunes, which allocates), a second is measured."""
    import torch

    compiled = torch.compile(_fresh_flex_entry(), dynamic=False)
    query, key = call.tensors[0], call.tensors[1]  # type: ignore[index]
    options = {
        "scale": call.scale,
        "enable_gqa": query.shape[-3] != key.shape[-3],
        "kernel_options": _public_options(call.kernel_options) or None,
    }
    stance = getattr(torch.compiler, "set_stance", None)
    grad_out = dense[2] if dense is not None else None
    before, breaks = recorder.mark(), _graph_breaks()
    base = 0
    try:
        for measured in (False, True) if cuda else (True,):
            if measured:
                base = _peak_start(cuda)
            # the default stance: a set_stance("force_eager") of the user's is what is being fixed
            with (
                stance("default") if stance is not None else contextlib.nullcontext(),
                torch.set_grad_enabled(backward),
            ):
                out = compiled(*inputs, score_mod, mask, **options)
                if backward:
                    if grad_out is None:
                        grad_out = torch.randn_like(out)
                    out.backward(grad_out)
            if not measured:
                _grads(inputs)
    except Exception as exc:
        raise NotReplayable(f"the compiled call raised {_said(exc)}") from exc
    finally:
        # every thread's: a CUDA backward runs on autograd's device thread, not on the replay's
        outcome.dense_kernels = len(recorder.events[max(0, before - recorder.dropped) :])
        broke += [_first_line(r) for r, n in _graph_breaks().items() if n > breaks.get(r, 0)]
    outcome.fused_peak_bytes = _peak_since(cuda, base)
    return out.detach(), _grads(inputs)


def _difference(dense: tuple[Any, list[Any], Any], fused: tuple[Any, list[Any]]) -> tuple[float, bool]:
    """The largest |dense - fused| over the output and the gradients; and whether it is too far off
    (beyond a share of the dense output's magnitude, or NaN where the other is not)."""
    import torch

    pairs = [(dense[0], fused[0])] + [(a, b) for a, b in zip(dense[1], fused[1], strict=True) if a is not None]
    largest, off = 0.0, False
    for a, b in pairs:
        if b is None:
            continue
        a, b = a.float(), b.float()
        if bool((torch.isnan(a) != torch.isnan(b)).any()):
            return float("nan"), True
        finite = ~torch.isnan(a)
        diff = float((a - b).abs()[finite].max()) if bool(finite.any()) else 0.0
        scale = float(a.abs()[finite].max()) if bool(finite.any()) else 0.0
        largest = max(largest, diff)
        off = off or diff > _RELATIVE_TOLERANCE * max(scale, 1e-6)
    return largest, off


# called from the dense kernel, in frames dynamo may run eagerly (dynamo_skip.py says why)
for _bookkeeping in (FixReplay._capture, _captured, _site_key, TensorSpec.of):
    skip_tree(_bookkeeping)
