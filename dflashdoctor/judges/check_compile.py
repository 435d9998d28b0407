"""Judges the check-compile probe's observations: one check line per question, findings with fixes.

Ground truth first: a dense-kernel event in a target phase means the target ran dense, whatever the
target looks like. Dynamo's compile records then say why: a recompile-limit failure or an exception
that got flex_attention's frame skipped explains the dense calls of a "compiled" wrapper; without
either, the target simply is not compiled.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge, size_text
from dflashdoctor.judges.dense_cause import FIX_BACKEND, FIX_SKIPPED_FRAME, FIX_WRAPPER, recompile_limit
from dflashdoctor.judges.dynamo_causes import (
    DENSE_BACKENDS,
    last_guard,
    parse_guard,
    raised_exception,
    recompile_limit_record,
    skipped_frame_record,
    why_the_guard_recompiles,
)
from dflashdoctor.judges.kernel_resources import OutOfResources, out_of_resources_finding
from dflashdoctor.judges.raised_cause import explain_raised
from dflashdoctor.judges.tables import shape_subject
from dflashdoctor.observations import CheckCompileObservations
from dflashdoctor.probe_support import first_line
from dflashdoctor.records import BoundName, CompileRecord, Phase, PhaseRecord, SourceSite
from dflashdoctor.report import Bar, CheckStatus, Comparison, ProbeResult, Where

_SCORE_MATRIX_FRACTION = 0.5  # a fused peak this close to one score matrix means it was built
# Relative error of the output against a float32 eager reference, by input dtype. Gradients sum
# over the whole sequence, so they get twice the room.
_OUT_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 1e-2, "bfloat16": 1e-2}
_GRAD_TOLERANCE_FACTOR = 2
_REFS_FLEX = "https://pytorch.org/blog/flexattention/"
_REFS_RECOMPILE = "https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html"


def _where(site: SourceSite | None) -> Where | None:
    if not site:
        return None
    return Where(file=site["file"], line=site["line"], function=site["function"], module=site.get("module"))


def _bound_at(bound: BoundName | None) -> Where | None:
    return Where(file=bound["file"], line=bound["line"], module=bound["module"]) if bound else None


def _peak(phase: PhaseRecord | None) -> int | None:
    return phase["peak_bytes"] if phase else None


def _backward_s(phase: PhaseRecord | None) -> float | None:
    return phase.get("backward_s") if phase else None


def _ratio(dense: int | None, fused: int | None) -> float | None:
    if dense is None or fused is None:
        return None
    return round(dense / max(fused, 1), 1)


class CheckCompileJudge(Judge):
    def __init__(self, observations: CheckCompileObservations, budgets: Budgets) -> None:
        super().__init__("check-compile", budgets)
        self.observations = observations
        events = [e for e in observations.dense_events if Phase.calls_target(e.phase)]
        self.dense_fwd = [e for e in events if e.kind == "forward"]
        self.dense_bwd = [e for e in events if e.kind == "backward"]
        self.compiles = [c for c in observations.compiles if Phase.calls_target(c["phase"])]
        self.phases = observations.phases

    def judge(self) -> ProbeResult:
        self._instrumentation()
        self._target()
        self._target_error()
        self._fused()
        self._memory()
        self._numerics()
        self._varying()
        self._graph_breaks()
        self._timing()
        self._oom()
        self.measurements.update(shape=self.observations.shape.to_dict(), mask=self.observations.mask)
        self.subject = shape_subject(
            self.observations.device, self.observations.device_name, self.observations.shape, self.observations.mask
        )
        return self.result()

    def _instrumentation(self) -> None:
        for why in (self.observations.hook_unavailable, self.observations.dynamo_watch_unavailable):
            if why:
                self.findings.append(
                    finding(
                        "instrumentation-unavailable",
                        "Part of the instrumentation could not be installed on this torch",
                        detail=why,
                        fix="Report the torch version to dflashdoctor; the other checks still ran.",
                    )
                )

    # -- static -----------------------------------------------------------------------------
    def _target(self) -> None:
        info = self.observations.target
        self.measurements["target_kind"] = info["kind"]
        rebound = info.get("rebound")
        if info["kind"] == "raw-flex" or rebound:
            name = rebound["name"] if rebound else info["spec"]
            where = (
                Where(file=rebound.get("file"), line=rebound.get("line"), module=rebound.get("module"))
                if rebound
                else None
            )
            self.findings.append(
                finding(
                    "not-compiled",
                    f"`{name}` is the raw flex_attention function, not a torch.compile wrapper",
                    detail=(
                        f"`{name}` is bound to torch.nn.attention.flex_attention.flex_attention itself"
                        + (f", last assigned at line {rebound['line']}" if rebound and rebound.get("line") else "")
                        + ". Every call through it runs the dense kernel, which builds the whole "
                        "[B, H, Lq, Lkv] float32 score matrix, forward and backward."
                    ),
                    where=where,
                    evidence={"target": info},
                    fix=f"Bind `{name}` once to `torch.compile(flex_attention)` and remove the later "
                    "assignment that rebinds it to the raw function.",
                    refs=[_REFS_FLEX],
                )
            )
            self._check("target", "fail", f"`{name}` is the raw flex_attention (not compiled)", "not-compiled")
        elif info["kind"] == "compiled-wrapper":
            backend = (info.get("backends") or {}).get(info["spec"].rpartition(":")[2])
            summary = f"torch.compile wrapper of {info['wraps']}" + (f" (backend {backend})" if backend else "")
            if backend in DENSE_BACKENDS:
                self._check("target", "fail", f"{summary}: no Inductor, flex_attention runs dense", "dense-forward")
            else:
                self._check("target", "pass", summary)
        elif info["compiled_globals"]:
            names = ", ".join(f"`{n}`" for n in info["compiled_globals"])
            self._check("target", "pass", f"{info['qualname']} calls the compiled wrapper {names}")
        else:
            self._check("target", "info", f"{info['qualname']} ({info['kind']}); judged by what it runs")

    def _target_error(self) -> None:
        """The call line: how the target was called (recordings made before the probe planned its
        calls have no plan), and whether that call raised."""
        call = self.observations.target.get("call")
        called_as = f"called as {call['text']}" if call else ""
        if call:
            self.measurements["call"] = call
        error = self.observations.target_error
        if not error:
            if call:
                self._check("call", "info", called_as)
            return
        message = first_line(error["message"], "")
        resources = OutOfResources.read(error["message"], error.get("traceback") or "")
        if resources is not None:
            where = _where(error.get("where"))
            self.findings.append(out_of_resources_finding(resources, f"phase {error['phase']}", where))
            self._check(
                "call", "fail", f"a kernel does not fit this GPU ({resources.resource})", "kernel-out-of-resources"
            )
            return
        cause = explain_raised(error, self.compiles, [])
        self.findings.append(
            finding(
                "target-raised",
                f"The target raised {error['type']} in phase {error['phase']}"
                + (f": {cause.summary}" if cause else ""),
                detail=f"{error['type']}: {message}"
                + (f" (it was {called_as})" if call else "")
                + (f". Cause ({cause.kind}): {cause.summary}." if cause else ""),
                where=(cause.where if cause and cause.where else _where(error.get("where"))),
                evidence={"traceback": error["traceback"], "message": error["message"]}
                | ({"cause_kind": cause.kind} if cause else {}),
                fix=cause.fix
                if cause
                else "Run the target once by hand at this shape; the remaining checks need it to succeed.",
            )
        )
        raised = f"target raised {error['type']} in {error['phase']}"
        self._check("call", "fail", f"{raised}; {called_as}" if call else raised, "target-raised")

    # -- dense paths and why ------------------------------------------------------------------
    def _fused(self) -> None:
        n_fwd, n_bwd = len(self.dense_fwd), len(self.dense_bwd)
        self.measurements.update(dense_forward_calls=n_fwd, dense_backward_calls=n_bwd)
        limit, skip = recompile_limit_record(self.compiles), skipped_frame_record(self.compiles)
        if limit:
            self._recompile_limit_finding(limit)
        elif skip:
            self._skip_finding(skip)
        elif n_fwd or n_bwd:
            self._dense_findings()
        cause = ["recompile-limit-fallback"] if limit else ["dynamo-skip-fallback"] if skip else []
        fwd_codes = cause or ["dense-forward"]
        if n_fwd:
            self._check("forward", "fail", f"dense forward in {n_fwd} of the target's calls", *fwd_codes)
        elif not any("forward_s" in phase for name, phase in self.phases.items() if Phase.calls_target(name)):
            self._check("forward", "skip", "never completed: the target failed before any forward returned")
        elif not self.observations.hook_unavailable:
            self._check("forward", "pass", "fused: no dense forward kernel ran")
        if not self.observations.backward_checked:
            self.findings.append(
                finding(
                    "backward-not-checked",
                    f"Backward not checked on {self.observations.device}",
                    detail="torch refuses flex_attention backward on CPU inputs that require grad "
                    "(eager and compiled alike), so the fused backward can only be proven on a GPU.",
                    fix="Run `dflashdoctor check-compile --device cuda` on a GPU node.",
                )
            )
            self._check("backward", "skip", f"not checked on {self.observations.device}", "backward-not-checked")
        elif n_bwd:
            self._check(
                "backward", "fail", f"dense backward in {n_bwd} of the target's calls", *(cause or ["dense-backward"])
            )
        elif not self._backward_completed():
            raised = self.observations.target_error["phase"] if self.observations.target_error else ""
            why = "it raised" if Phase.is_backward(raised) else "the target's forward failed first"
            self._check("backward", "skip", f"never completed: {why}")
        else:
            self._check("backward", "pass", "fused: no dense backward kernel ran")

    def _backward_completed(self) -> bool:
        return any(
            Phase.is_backward(name) and Phase.calls_target(name) and "backward_s" in phase
            for name, phase in self.phases.items()
        )

    def _first_dense_site(self, *, either: bool = False) -> Where | None:
        """Where the first dense forward (`either`: or, with none, backward) kernel was called from."""
        events = self.dense_fwd or (self.dense_bwd if either else [])
        return _where(events[0].site) if events else None

    def _dense_evidence(self) -> dict[str, Any]:
        sample = (self.dense_fwd or self.dense_bwd)[0]
        return {
            "dense_forward_calls": len(self.dense_fwd),
            "dense_backward_calls": len(self.dense_bwd),
            "phases": sorted({e.phase for e in self.dense_fwd + self.dense_bwd}),
            "first_event": sample.to_dict(),
        }

    def _dense_findings(self) -> None:
        backends = self.observations.target.get("backends") or {}
        dense_backends = {name: b for name, b in backends.items() if b in DENSE_BACKENDS}
        if dense_backends:
            names = ", ".join(f"`{n}` (backend={b!r})" for n, b in dense_backends.items())
            cause = (
                f"The target is compiled, but {names} compiles without Inductor: that backend runs "
                "flex_attention's dense kernel just like eager."
            )
            fix = FIX_BACKEND
        else:
            cause = (
                "flex_attention only fuses when it runs inside torch.compile with Inductor; "
                "called outside, it warns once per process and then stays silent."
            )
            fix = FIX_WRAPPER
        for kind, events in (("forward", self.dense_fwd), ("backward", self.dense_bwd)):
            if not events:
                continue
            first = events[0]
            self.findings.append(
                finding(
                    f"dense-{kind}",
                    f"flex_attention {kind} ran the unfused dense kernel ({len(events)} calls)",
                    detail=(
                        f"The dense {kind} kernel ran for q {first.q_shape} kv {first.kv_shape} "
                        f"{first.dtype}, building a float32 score matrix of "
                        f"{size_text(first.score_matrix_bytes)} per call. {cause}"
                    ),
                    where=_where(first.site) or _bound_at(self.observations.target.get("assigned")),
                    evidence={**self._dense_evidence(), "stack": first.stack, "backends": backends},
                    fix=fix,
                    refs=[_REFS_FLEX],
                )
            )

    def _recompile_limit_finding(self, limit: CompileRecord) -> None:
        reasons = [reason for c in self.compiles if (reason := c.get("recompile_reason"))]
        guard = last_guard(self.compiles, limit, self.observations.target.get("file"))
        limit_value = self.observations.recompile_limit
        why = why_the_guard_recompiles(guard)
        self.findings.append(
            finding(
                "recompile-limit-fallback",
                f"Recompile limit ({limit_value}) hit: flex_attention fell back to the dense kernel",
                detail=(
                    f"Dynamo recompiled `{limit.get('co_name') or 'flex_attention'}` each time the guard "
                    f"`{guard.expression}` failed"
                    + (f" (source: `{guard.source}`)" if guard.source else "")
                    + f". {why}Past torch._dynamo.config.recompile_limit ({limit_value}) dynamo stopped "
                    f"compiling the frame and ran it eagerly from phase {limit['phase']} on: "
                    f"{len(self.dense_fwd)} dense forward and {len(self.dense_bwd)} dense backward calls "
                    "followed, with one log line as the only sign."
                ),
                where=guard.where or self._first_dense_site(),
                evidence={
                    "guard": guard.expression,
                    "recompile_limit": limit_value,
                    "limit_hit_in_phase": limit["phase"],
                    "recompile_reasons": [first_line(r, "") for r in reasons][-10:],
                    **(self._dense_evidence() if self.dense_fwd or self.dense_bwd else {}),
                },
                fix=recompile_limit(self.compiles, limit, [], self.observations.target.get("file")).fix,
                refs=[_REFS_RECOMPILE],
            )
        )

    def _skip_finding(self, skip: CompileRecord) -> None:
        exc = raised_exception(skip)
        raised_at = f"{skip.get('fail_user_frame_filename')}:{skip.get('fail_user_frame_lineno')}"
        where = self._first_dense_site(either=True) or Where(
            file=skip.get("fail_user_frame_filename"), line=skip.get("fail_user_frame_lineno")
        )
        self.findings.append(
            finding(
                "dynamo-skip-fallback",
                f"An exception inside the compiled `{skip.get('co_name')}` frame made dynamo skip it: "
                "dense from then on",
                detail=(
                    f"During phase {skip['phase']} the compiled frame raised {exc} at {raised_at}. "
                    "Dynamo marked the code object as skipped for the rest of the process, "
                    "also for fresh torch.compile wrappers, "
                    f"so the retry and every later call ran the dense kernel ({len(self.dense_fwd)} dense "
                    f"forward, {len(self.dense_bwd)} dense backward calls seen; the location below is the "
                    "first of them)."
                ),
                where=where,
                evidence={
                    "exception": exc,
                    "raised_at": raised_at,
                    "fail_type": skip.get("fail_type"),
                    "phase": skip["phase"],
                    **(self._dense_evidence() if self.dense_fwd or self.dense_bwd else {}),
                },
                fix=FIX_SKIPPED_FRAME,
                refs=[_REFS_RECOMPILE],
            )
        )

    # -- memory and numerics ------------------------------------------------------------------
    def _warm_peak(self, backward: bool) -> int | None:
        peaks = [
            peak
            for name, p in self.phases.items()
            if Phase.is_warm(name) and Phase.is_backward(name) == backward and (peak := p["peak_bytes"]) is not None
        ]
        return max(peaks) if peaks else None

    def _memory(self) -> None:
        score = self._score_matrix_bytes()
        self.measurements["score_matrix_bytes"] = score
        if self.observations.device != "cuda":
            self._check(
                "memory",
                "skip",
                f"peak memory is measured on CUDA only; one dense score matrix here is {size_text(score)}",
            )
            return
        fwd, bwd = self._warm_peak(backward=False), self._warm_peak(backward=True)
        if fwd is None and self.observations.target_error:
            phase = self.observations.target_error.get("phase") or "its first call"
            self._check("memory", "skip", f"not measured: the target raised in {phase} before its warm calls")
            return
        eager_fwd = _peak(self.phases.get(Phase.EAGER))
        eager_bwd = _peak(self.phases.get(Phase.backward(Phase.EAGER)))
        fwd_ratio, bwd_ratio = _ratio(eager_fwd, fwd), _ratio(eager_bwd, bwd)
        self.measurements.update(
            fwd_peak_bytes=fwd,
            bwd_peak_bytes=bwd,
            dense_fwd_peak_bytes=eager_fwd,
            dense_bwd_peak_bytes=eager_bwd,
            fwd_dense_over_fused=fwd_ratio,
            bwd_dense_over_fused=bwd_ratio,
        )
        for title, fused, dense in (("Forward peak memory", fwd, eager_fwd), ("Backward peak memory", bwd, eager_bwd)):
            if fused is not None and dense is not None:
                self.comparisons.append(
                    Comparison(title=title, unit="bytes", bars=[Bar("target (warm)", fused), Bar("eager dense", dense)])
                )
        parts = [f"fwd {size_text(fwd)} vs dense {size_text(eager_fwd)} ({fwd_ratio}x)"]
        if bwd is not None:
            parts.append(f"bwd {size_text(bwd)} vs dense {size_text(eager_bwd)} ({bwd_ratio}x)")
        materialized = any(p is not None and p >= _SCORE_MATRIX_FRACTION * score for p in (fwd, bwd))
        if materialized:
            self.findings.append(
                finding(
                    "score-matrix-materialized",
                    "The target's peak memory shows the full score matrix was built",
                    detail=(
                        f"Warm forward peak {size_text(fwd)}, backward {size_text(bwd)}, against one float32 "
                        f"score matrix of {size_text(score)}: a fused kernel never holds it."
                    ),
                    evidence={"fwd_peak_bytes": fwd, "bwd_peak_bytes": bwd, "score_matrix_bytes": score},
                    fix="See the dense-path findings for the call that built it.",
                )
            )
        out_of_memory = [r for r in self.observations.oom if Phase.calls_target(r["phase"])]
        if out_of_memory:
            parts.insert(0, f"out of memory in {len(out_of_memory)} of the target's phases")
        codes = (["score-matrix-materialized"] if materialized else []) + (["oom"] if out_of_memory else [])
        self._check("memory", "fail" if codes else "pass", "; ".join(parts), *codes)

    def _score_matrix_bytes(self) -> int:
        shape = self.observations.shape
        return shape.batch * shape.heads * shape.q_len * shape.kv_len * 4

    def _numerics(self) -> None:
        numerics = self.observations.numerics
        errors = {
            k.removesuffix("_rel_err"): float(v)
            for k, v in numerics.items()
            if k.endswith("_rel_err") and isinstance(v, int | float)
        }
        if not errors:
            return
        dtype = self.observations.shape.dtype
        tolerance = {name: _OUT_TOLERANCE[dtype] * (1 if name == "out" else _GRAD_TOLERANCE_FACTOR) for name in errors}
        self.measurements.update({f"{k}_rel_err": v for k, v in errors.items()})
        self.measurements["out_tolerance"] = _OUT_TOLERANCE[dtype]
        bad = {k: v for k, v in errors.items() if not v <= tolerance[k]}  # NaN fails too
        summary = ", ".join(f"{k} {v:.2g}" for k, v in errors.items())
        limits = f"tolerance {_OUT_TOLERANCE[dtype]:g}" + (
            f", gradients {_OUT_TOLERANCE[dtype] * _GRAD_TOLERANCE_FACTOR:g}" if len(errors) > 1 else ""
        )
        if bad:
            self.findings.append(
                finding(
                    "numeric-mismatch",
                    "The compiled target disagrees with its eager float32 reference",
                    detail=f"Relative errors {summary}; {limits} for {dtype}. Over: {', '.join(bad)}.",
                    evidence={"rel_err": errors, "tolerance": tolerance, "reference": numerics.get("reference")},
                    fix="Compare the target's score_mod/mask_mod under compile and eager; check for state the "
                    "target changes between calls.",
                )
            )
        status: CheckStatus = "fail" if bad else "pass"
        self._check("numerics", status, f"relative error {summary} ({limits})", "numeric-mismatch")

    def _varying(self) -> None:
        vary = self.observations.vary
        recompiles = [reason for c in self.compiles if (reason := c.get("recompile_reason"))]
        self.measurements["recompiles"] = len(recompiles)
        self.measurements["vary"] = [asdict(call) for call in vary]
        if not vary:
            return
        dense_calls = sum(1 for call in vary if call.dense_forward or call.dense_backward)
        lengths = f"{vary[0].kv_len}..{vary[-1].kv_len}"
        over = len(recompiles) > self.budgets.max_recompiles
        explained = any(f.code in ("recompile-limit-fallback", "dynamo-skip-fallback") for f in self.findings)
        if over and not explained:
            target_file = self.observations.target.get("file")
            reasons = [parse_guard(reason, target_file).expression for reason in recompiles]
            self.findings.append(
                finding(
                    "recompiles",
                    f"{len(recompiles)} recompiles, above the budget of {self.budgets.max_recompiles}",
                    detail="Each recompile costs a compile and brings the recompile limit closer. "
                    f"The guards that failed, last first: {'; '.join(reversed(reasons[-3:]))}",
                    evidence={"recompile_reasons": [first_line(reason, "") for reason in recompiles]},
                    fix="Make the varying value a tensor or a dynamic dimension; see the guard named above.",
                )
            )
        status: CheckStatus = "fail" if dense_calls else "warn" if over else "pass"
        self._check(
            "varying lengths",
            status,
            f"{len(vary)} context lengths ({lengths}): {len(recompiles)} recompiles, {dense_calls} calls ran dense",
            "recompiles",
            "recompile-limit-fallback",
            "dynamo-skip-fallback",
        )

    def _graph_breaks(self) -> None:
        breaks = self.observations.graph_breaks
        self.measurements.update(graph_breaks=sum(breaks.values()), graph_break_reasons=breaks)
        self._graph_break_check(breaks, "while the target ran")

    def _timing(self) -> None:
        first = self.phases.get(Phase.FIRST)
        first_compiles = [c for c in self.compiles if c["phase"] == Phase.FIRST]
        compile_s = sum(c.get("entire_frame_compile_time_s") or 0 for c in first_compiles)
        hits = sum(c.get("inductor_fx_local_cache_hit_count") or 0 for c in first_compiles)
        misses = sum(c.get("inductor_fx_local_cache_miss_count") or 0 for c in first_compiles)
        warm_backward = [p["backward_s"] for n, p in self.phases.items() if Phase.is_warm(n) and "backward_s" in p]
        self.measurements["phase_wall_s"] = {
            "import": self.observations.import_s,
            "setup": self.observations.setup_s,
            **{name: phase.get("wall_s") for name, phase in self.phases.items()},
        }
        self.measurements.update(
            first_call_s=first.get("forward_s") if first else None,
            first_backward_s=_backward_s(self.phases.get(Phase.backward(Phase.FIRST))),
            warm_forward_s=first.get("warm_forward_median_s") if first else None,
            warm_backward_s=statistics.median(warm_backward) if warm_backward else None,
            compile_s=round(compile_s, 3),
            fx_graph_cache_hits=hits,
        )
        call_s, warm_s = (first.get("forward_s"), first.get("warm_forward_median_s")) if first else (None, None)
        if call_s is None or warm_s is None:
            return
        cache = "warm Inductor cache" if hits else "cold Inductor cache" if misses else "no Inductor graph"
        self.comparisons.append(
            Comparison(
                title="Forward call time",
                unit="seconds",
                bars=[
                    Bar("first call (compile)", call_s),
                    Bar("warm call (median)", warm_s),
                ],
            )
        )
        self._check(
            "compile time",
            "info",
            f"first call {call_s:.2f} s ({cache}, dynamo+inductor {compile_s:.2f} s), warm {warm_s * 1e3:.2f} ms",
        )

    def _oom(self) -> None:
        records = self.observations.oom
        baseline = [r for r in records if not Phase.calls_target(r["phase"])]
        if baseline:
            self.measurements["dense_baseline_oom"] = baseline[0]["message"]
        target = [r for r in records if Phase.calls_target(r["phase"])]
        if not target:
            return
        first = target[0]
        self.findings.append(
            finding(
                "oom",
                f"Out of memory in {len(target)} of the target's phases, first in {first['phase']}",
                detail=first["message"],
                evidence={"phases": [r["phase"] for r in target], "first": first},
                fix="Check the dense-path findings: a dense flex_attention call builds the whole score matrix.",
            )
        )


def judge(observations: CheckCompileObservations, budgets: Budgets) -> list[ProbeResult]:
    return [CheckCompileJudge(observations, budgets).judge()]
