"""Probe: is a flex_attention wrapper really compiled, and fused forward and backward?

Runs inside the probed interpreter (standard library, torch, dflashdoctor's probed side). It only
observes: it calls the target the way training does and records what ran (dense-kernel events,
dynamo's compile records), how much memory each phase took and how long, and how far the output
is from the eager reference. The doctor judges those observations into findings.

Phases, in order, so that the target's first call is a true cold call:
  target:first    first forward (compile included), then backward where the device supports it
  target:warm     a few more forward/backward calls at the same shape (steady-state time)
  eager           plain flex_attention, forward and backward: the dense baseline
  reference       fresh inputs; the target against itself run eagerly in float32 (numerics)
  vary:<kv_len>   the target at N more context lengths, as a training run sees them
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import os  # noqa: E402  (the clock above times the imports)
import statistics  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import traceback  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

from dflashdoctor import call_plan, probe_support  # noqa: E402
from dflashdoctor.hooks.dynamo_watch import DynamoWatch  # noqa: E402
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder  # noqa: E402
from dflashdoctor.hooks.memory import PeakMemory  # noqa: E402
from dflashdoctor.observations import CheckCompileObservations, GraphBreakSite, VaryCall, dump  # noqa: E402
from dflashdoctor.probe_configs import CheckCompileConfig  # noqa: E402
from dflashdoctor.probe_support import UsageError, probe_main, resolve_device  # noqa: E402
from dflashdoctor.records import Numerics, OomRecord, Phase, PhaseRecord, SourceSite, TargetError  # noqa: E402
from dflashdoctor.redaction import redact_text  # noqa: E402
from dflashdoctor.reference.masks import build_block_mask  # noqa: E402
from dflashdoctor.shapes import AttentionShape, shape_problem, shape_with  # noqa: E402
from dflashdoctor.targets import describe, plan_target_call, resolve  # noqa: E402

IMPORT_S = time.perf_counter() - _STARTED

WARM_CALLS = 3
_OOM_ERRORS: tuple[type[BaseException], ...] = (getattr(torch, "OutOfMemoryError", MemoryError), MemoryError)
_OOM_OR_RUNTIME_ERRORS: tuple[type[BaseException], ...] = (*_OOM_ERRORS, RuntimeError)
# The probe's own frames between it and the target: never the site of a dense call or an error.
_HARNESS = tuple(os.path.abspath(f) for f in (__file__, probe_support.__file__, call_plan.__file__))


class TargetFailed(Exception):
    """The target raised on a valid call; the remaining target phases cannot run."""


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _inputs(shape: AttentionShape, device: str, kv_len: int, grad: bool, seed: int):
    # Drawn on the device itself: drawing on the CPU and copying took about 0.3 s per call at the
    # H200's full-scale shape, 3 s of the gate's critical path over the varying-length calls.
    generator = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape.dtype)

    def tensor(heads: int, length: int) -> torch.Tensor:
        data = torch.randn(shape.batch, heads, length, shape.head_dim, generator=generator, device=device)
        return data.to(dtype).requires_grad_(grad)

    return tensor(shape.heads, shape.q_len), tensor(shape.kv_heads, kv_len), tensor(shape.kv_heads, kv_len)


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    if not torch.isfinite(actual).all():
        return float("inf")
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def _error_site(exc: BaseException) -> SourceSite | None:
    """The innermost frame of the user's code in the traceback (not torch's, the stdlib's or the probe's)."""
    library = (os.path.dirname(torch.__file__), sysconfig.get_paths()["stdlib"])
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(library) and os.path.abspath(f.filename) not in _HARNESS
    ]
    if not frames:
        return None
    last = frames[-1]
    return SourceSite(file=last.filename, line=last.lineno, function=last.name)


class CheckCompileProbe:
    def __init__(self, config: CheckCompileConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.shape = shape_with(self.device, config.shape)
        problem = shape_problem(self.shape, config.mask)
        if problem:
            raise UsageError(problem)
        self.backward = self.device != "cpu"  # torch has no flex_attention backward on CPU
        self.dense = DenseFlexRecorder(skip_files=_HARNESS)
        self.memory = PeakMemory(self.device)
        self.phases: dict[str, PhaseRecord] = {}
        self.oom: list[OomRecord] = []
        self.target_error: TargetError | None = None

    @contextmanager
    def phase(self, name: str):
        """Label dense events and compiles with `name`; time it; turn OOM into an observation."""
        self.dense.phase = name
        record = self.phases.setdefault(name, PhaseRecord(wall_s=0.0, peak_bytes=None, compiles=[]))
        self.memory.start()
        started = time.perf_counter()
        try:
            yield record
        except _OOM_ERRORS as exc:
            record["oom"] = True
            self.oom.append(self._oom_record(name, exc))
        finally:
            _sync(self.device)
            record["wall_s"] = round(time.perf_counter() - started, 6)
            record["peak_bytes"] = self.memory.stop()
            record["compiles"] = self.watch.collect(name)
            self.dense.phase = ""

    @contextmanager
    def _allocating(self):
        """The probe's own inputs and mask: a shape too large for this machine is the input's fault
        (exit 2), not a finding about the target and not a crash."""
        try:
            yield
        except _OOM_OR_RUNTIME_ERRORS as exc:
            if not isinstance(exc, _OOM_ERRORS) and "allocate" not in str(exc):
                raise
            message = probe_support.first_line(str(exc), type(exc).__name__)[:300]
            raise UsageError(f"{self.shape.label()} does not fit on {self.device}: {message}") from None

    def _oom_record(self, phase: str, exc: BaseException) -> OomRecord:
        message = probe_support.first_line(str(exc), type(exc).__name__)
        record = OomRecord(phase=phase, message=redact_text(message)[:500], last_dense_events=[])
        if self.device == "cuda":
            record["allocated_bytes"] = torch.cuda.memory_allocated()
            record["reserved_bytes"] = torch.cuda.memory_reserved()
            torch.cuda.empty_cache()
        record["last_dense_events"] = [e.to_record() for e in self.dense.events[-3:]]
        return record

    def call_target(self, target, q, k, v, block_mask):
        """Every call to the target goes through its call plan: the same arguments in every phase."""
        with self._target_errors():
            out = self.plan.call(target, q, k, v, block_mask)
            if not isinstance(out, torch.Tensor):  # what flex_attention returns; None cannot be checked
                raise TypeError(f"the target returned {type(out).__name__}, not the attention output tensor")
            return out

    def target_backward(self, out, grad) -> None:
        """The target's backward: Inductor compiles it at the first call, so a kernel that does not
        fit the GPU (the compiled backward's tiles, most often) raises here, not in the forward."""
        with self._target_errors():
            out.backward(grad)

    @contextmanager
    def _target_errors(self):
        """What the target raised is an observation, with the phase it raised in; the phases after
        it are skipped (TargetFailed). Out of memory is the phase's own observation."""
        try:
            yield
        except _OOM_ERRORS:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit or a raised Ctrl-C: the target's doing
            self.target_error = {
                "type": type(exc).__name__,
                "message": redact_text(str(exc))[:2000],  # a secret it quotes is kept by no report
                "phase": self.dense.phase,
                "where": _error_site(exc),
                "traceback": redact_text(traceback.format_exc())[-3000:],
            }
            raise TargetFailed from exc

    def run(self) -> CheckCompileObservations:
        setup_started = time.perf_counter()
        target, module, attr = resolve(self.config.target)
        shape = self.shape
        with self._allocating():
            q, k, v = _inputs(shape, self.device, shape.kv_len, self.backward, seed=0)
        self.plan = plan_target_call(target, self.config.target, shape.heads, shape.kv_heads)
        info = describe(target, module, attr, self.config.target)
        info.call = self.plan.to_dict()
        self.watch = DynamoWatch()
        with self._allocating():
            mask = build_block_mask(self.config.mask, shape.q_len, shape.kv_len, self.device, shape.block_size)
        setup_s = time.perf_counter() - setup_started
        vary: list[VaryCall] = []
        numerics = Numerics()
        with self.dense:
            try:
                self._target_phases(target, q, k, v, mask)
                self._eager_phase(q, k, v, mask)
                numerics = self._numerics(target, mask)
                vary = self._vary(target)
            except TargetFailed:
                pass
        return CheckCompileObservations(
            device=self.device,
            device_name=torch.cuda.get_device_name() if self.device == "cuda" else "cpu",
            torch=torch.__version__,
            python=sys.version.split()[0],
            shape=shape,
            mask=self.config.mask,
            backward_checked=self.backward,
            target=info.to_dict(),
            hook_unavailable=self.dense.unavailable,
            dynamo_watch_unavailable=self.watch.unavailable,
            recompile_limit=getattr(torch._dynamo.config, "recompile_limit", None),
            phases=self.phases,
            numerics=numerics,
            vary=vary,
            dense_events=list(self.dense.events),
            compiles=self.watch.records,
            graph_breaks=self.watch.graph_breaks,
            graph_break_sites=[GraphBreakSite(**site) for site in self.watch.graph_break_sites],
            oom=self.oom,
            target_error=self.target_error,
            import_s=round(IMPORT_S, 3),
            setup_s=round(setup_s, 3),
        )

    def _forward_backward(self, target, q, k, v, mask, name: str) -> None:
        out = None
        with self.phase(name) as record:
            started = time.perf_counter()
            out = self.call_target(target, q, k, v, mask)
            _sync(self.device)
            record["forward_s"] = round(time.perf_counter() - started, 6)
        if self.backward and out is not None:
            with self.phase(Phase.backward(name)) as record:
                started = time.perf_counter()
                self.target_backward(out, torch.ones_like(out))
                _sync(self.device)
                record["backward_s"] = round(time.perf_counter() - started, 6)

    def _target_phases(self, target, q, k, v, mask) -> None:
        self._forward_backward(target, q, k, v, mask, Phase.FIRST)
        for i in range(WARM_CALLS):
            self._forward_backward(target, q, k, v, mask, Phase.warm(i))
        # a call that ran out of memory has no time
        warm = [w for i in range(WARM_CALLS) if (w := self.phases[Phase.warm(i)].get("forward_s")) is not None]
        self.phases[Phase.FIRST]["warm_forward_median_s"] = statistics.median(warm) if warm else None

    def _eager_phase(self, q, k, v, mask) -> None:
        enable_gqa = self.shape.heads != self.shape.kv_heads
        q, k, v = (t.detach().requires_grad_(self.backward) for t in (q, k, v))
        out = None
        with self.phase(Phase.EAGER):
            out = flex_attention(q, k, v, block_mask=mask, enable_gqa=enable_gqa)
        if self.backward and out is not None:
            with self.phase(Phase.backward(Phase.EAGER)):
                out.backward(torch.ones_like(out))

    def _numerics(self, target, mask) -> Numerics:
        """The target on fresh inputs against the same target run eagerly in float32."""
        shape = self.shape
        q, k, v = _inputs(shape, self.device, shape.kv_len, self.backward, seed=1)
        ref_q, ref_k, ref_v = (t.detach().float().requires_grad_(self.backward) for t in (q, k, v))
        result = Numerics(reference="the target itself, eager (force_eager stance), float32 inputs")
        out = ref = grad_out = None
        with self.phase(Phase.NUMERICS):
            out = self.call_target(target, q, k, v, mask)
            generator = torch.Generator(device=self.device).manual_seed(2)
            grad_out = torch.randn(out.shape, generator=generator, device=self.device).to(out.dtype)
            if self.backward:
                self.target_backward(out, grad_out)
        if grad_out is None:  # the target ran out of memory; nothing to compare
            return result
        with self.phase(Phase.REFERENCE), torch.compiler.set_stance("force_eager"):
            ref = self.call_target(target, ref_q, ref_k, ref_v, mask)
            if self.backward:
                ref.backward(grad_out.float())
        if out is None or ref is None:
            return result
        result["out_rel_err"] = _rel_err(out, ref)
        if self.backward:
            if q.grad is not None and ref_q.grad is not None:
                result["dq_rel_err"] = _rel_err(q.grad, ref_q.grad)
            if k.grad is not None and ref_k.grad is not None:
                result["dk_rel_err"] = _rel_err(k.grad, ref_k.grad)
            if v.grad is not None and ref_v.grad is not None:
                result["dv_rel_err"] = _rel_err(v.grad, ref_v.grad)
        return result

    def _vary(self, target) -> list[VaryCall]:
        """The target at growing context lengths: what a training run's batches look like."""
        shape = self.shape
        step = max(shape.block_size, (shape.kv_len // 16) // shape.block_size * shape.block_size)
        calls = []
        for i in range(self.config.vary):
            kv_len = shape.kv_len + (i + 1) * step
            mask = build_block_mask(self.config.mask, shape.q_len, kv_len, self.device, shape.block_size)
            q, k, v = _inputs(shape, self.device, kv_len, self.backward, seed=10 + i)
            name = Phase.vary(kv_len)
            before = len(self.dense.events)
            self._forward_backward(target, q, k, v, mask, name)
            new = self.dense.events[before:]
            backward = self.phases.get(Phase.backward(name))
            calls.append(
                VaryCall(
                    kv_len=kv_len,
                    dense_forward=sum(e.kind == "forward" for e in new),
                    dense_backward=sum(e.kind == "backward" for e in new),
                    forward_s=self.phases[name].get("forward_s"),
                    compiles=len(self.phases[name]["compiles"]) + (len(backward["compiles"]) if backward else 0),
                )
            )
        return calls


def run(config: CheckCompileConfig) -> dict[str, Any]:
    return dump(CheckCompileProbe(config).run())


if __name__ == "__main__":
    probe_main(run, CheckCompileConfig)
