"""Judges the trace-attention probe: each attention layer, each call site, and what they mean.

A site is one module calling attention through one implementation. Flex sites are fused unless the
dense-path hook fired during their calls; sites of other implementations are reported with what
they ran, since the question is where flex_attention runs and where it does not.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from dflashdoctor.codes import finding
from dflashdoctor.report import Check, Finding, ProbeResult, Where

_FLEX = "flex_attention"
_HF_FLEX_FIX = (
    "If you compile your own flex_attention wrapper, register it for the model: "
    "`AttentionInterface.register('flex_attention', your_wrapper)`; otherwise transformers compiles "
    "its own singleton lazily and re-wraps it whenever `training` flips."
)


def _origin(file: str | None) -> str:
    if not file:
        return "other"
    parts = os.path.normpath(file).split(os.sep)
    for package in ("transformers", "torch", "fla"):
        if package in parts and "site-packages" in parts:
            return package
    return "user code" if "site-packages" not in parts else "other package"


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def call_site(site: dict[str, Any]) -> dict[str, Any]:
    """The report row of one site (the fields DESIGN and the issue name, and the shapes)."""
    flex = site["impl"] == _FLEX
    if site["impl"] == "module-forward":
        via = f"module forward ({site['module_class']})"
    elif flex:
        via = "transformers attention interface: flex_attention (HF's compiled singleton)"
    else:
        via = f"transformers attention interface: {site['impl']}"
    verdict = ("dense" if site["dense_forward"] else "fused") if flex else f"not flex ({site['impl']})"
    return {
        "file": site.get("file"),
        "line": site.get("line"),
        "function": site.get("function"),
        "module": site["module"],
        "origin": _origin(site.get("file")) if site.get("file") else "transformers",
        "via": via,
        "impl": site["impl"],
        "calls": site["calls"],
        "verdict": verdict,
        "dense_forward": site["dense_forward"],
        "dense_backward": 0,
        "training": site["training"],
        "q_shape": site["q_shape"],
        "kv_shape": site["kv_shape"],
        "dtype": site["dtype"],
        "mask": site["mask"],
    }


class TraceAttentionJudge:
    def __init__(self, obs: dict[str, Any]) -> None:
        self.obs = obs
        self.sites = [call_site(s) for s in obs["sites"]]
        self.findings: list[Finding] = []
        self.checks: list[Check] = []

    def judge(self) -> ProbeResult:
        self._model()
        self._layers()
        self._flex_sites()
        self.measurements = {
            "model": self.obs["model"],
            "model_class": self.obs["model_class"],
            "scale": self.obs["scale"],
            "parameters": self.obs["parameters"],
            "attn_implementation": self.obs["attn_implementation"],
            "seq_len": self.obs["seq_len"],
            "backward": self.obs["backward"],
            "layers": self.obs["layers"],
            "call_sites": self.sites,
        }
        status = "fail" if any(f.severity == "error" for f in self.findings) else "pass"
        return ProbeResult(
            probe="trace-attention",
            status=status,
            findings=self.findings,
            measurements=self.measurements,
            checks=self.checks,
        )

    def _check(self, name: str, status: str, summary: str, *codes: str) -> None:
        self.checks.append(Check(name=name, status=status, summary=summary, codes=list(codes)))

    def _model(self) -> None:
        obs = self.obs
        self._check(
            "model",
            "info",
            f"{obs['model_class']} ({obs['model_type']}, {obs['parameters'] / 1e6:.3g}M parameters, "
            f"{obs['scale']} scale, attention {obs['attn_implementation']})",
        )
        if obs.get("hook_unavailable"):
            self.findings.append(
                finding(
                    "instrumentation-unavailable",
                    "Part of the tracing could not be installed on this torch/transformers",
                    detail=obs["hook_unavailable"],
                    fix="Report the versions to dflashdoctor; the layers seen by module hooks are still listed.",
                )
            )

    def _layers(self) -> None:
        layers = self.obs["layers"]
        tally = Counter((layer["kind"], layer["impl"]) for layer in layers)
        summary = ", ".join(f"{n} {kind} via {impl}" for (kind, impl), n in tally.items())
        self._check("layers", "info", f"{len(layers)} attention layers: {summary}")
        refused = self.obs.get("flex_refused")
        if not refused:
            return
        self.findings.append(
            finding(
                "flex-unsupported-model",
                f"{self.obs['model_class']} cannot use flex_attention",
                detail=(
                    f"transformers refuses attn_implementation='flex_attention' for this class ({refused}). "
                    f"Its layers run instead: {summary}. Any flex_attention in this pipeline lives "
                    "elsewhere: in the drafter and in your own code."
                ),
                evidence={"refusal": refused, "layers": layers},
                fix="Trace the drafter and your training script rather than this model; check your "
                "flex_attention entry with `dflashdoctor check-compile`.",
            )
        )
        self._check(
            "flex support", "info", f"{self.obs['model_class']} refuses flex_attention", "flex-unsupported-model"
        )

    def _flex_sites(self) -> None:
        flex = [s for s in self.sites if s["impl"] == _FLEX]
        if not flex:
            return
        dense = [s for s in flex if s["dense_forward"]]
        self.findings.append(
            finding(
                "hf-internal-flex-path",
                f"{len(flex)} layers call flex_attention through transformers' own integration",
                detail="These calls go through transformers.integrations.flex_attention, which compiles "
                "flex_attention itself, not through a wrapper of yours: "
                + ", ".join(s["module"] for s in flex[:8])
                + (" ..." if len(flex) > 8 else ""),
                where=Where(
                    file=flex[0]["file"], line=flex[0]["line"], function=flex[0]["function"], module=flex[0]["module"]
                ),
                evidence={"modules": [s["module"] for s in flex]},
                fix=_HF_FLEX_FIX,
            )
        )
        for site in dense:
            self.findings.append(
                finding(
                    "dense-forward",
                    f"{site['module']}: flex_attention forward ran the dense kernel ({site['dense_forward']} calls)",
                    detail="The call went through transformers' flex path but executed flex_attention's dense "
                    "kernel, which builds the whole score matrix.",
                    where=Where(file=site["file"], line=site["line"], function=site["function"], module=site["module"]),
                    evidence=site,
                    fix="Run `dflashdoctor check-compile` on the wrapper; look for recompile-limit or skipped frames.",
                )
            )
        self._repeat_kv(flex)
        calls = sum(s["calls"] for s in flex)
        self._check(
            "flex calls",
            "fail" if dense else "pass",
            f"{len(flex)} sites, {calls} calls: {len(dense)} sites dense, {len(flex) - len(dense)} fused",
            "dense-forward",
            "hf-internal-flex-path",
        )

    def _repeat_kv(self, flex: list[dict[str, Any]]) -> None:
        """transformers repeats K/V instead of using enable_gqa when the query heads are not a power of two."""
        expanded = [
            s
            for s in flex
            if len(s["q_shape"]) == 4 and s["q_shape"][1] != s["kv_shape"][1] and not _is_power_of_two(s["q_shape"][1])
        ]
        if not expanded:
            return
        first = expanded[0]
        factor = first["q_shape"][1] // first["kv_shape"][1]
        self.findings.append(
            finding(
                "repeat-kv-expansion",
                f"K/V repeated {factor}x to match {first['q_shape'][1]} query heads in {len(expanded)} layers",
                detail=(
                    f"With {first['q_shape'][1]} query heads (not a power of two) transformers' flex path repeats "
                    f"K and V from {first['kv_shape'][1]} heads instead of passing enable_gqa, so K/V memory and "
                    f"bandwidth grow {factor}x in the attention call."
                ),
                where=Where(file=first["file"], line=first["line"], function=first["function"], module=first["module"]),
                evidence={
                    "modules": [s["module"] for s in expanded],
                    "q_shape": first["q_shape"],
                    "kv_shape": first["kv_shape"],
                },
                fix="Call flex_attention through your own wrapper with enable_gqa=True, registered with "
                "AttentionInterface, or choose a power-of-two head count.",
            )
        )


def judge(observations: dict[str, Any]) -> ProbeResult:
    return TraceAttentionJudge(observations).judge()
