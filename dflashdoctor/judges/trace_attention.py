"""Judges the trace-attention probe: each attention layer, each call site, and what they mean.

A site is one module calling attention through one implementation. Flex sites are fused unless the
dense-path hook fired during their calls; sites of other implementations are reported with what
they ran, since the question is where flex_attention runs and where it does not.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge, count_text, size_text
from dflashdoctor.judges.dense_cause import Cause, CompileCall, DenseCall, explain
from dflashdoctor.judges.fla import fla_guard_finding, fla_import_stopped_finding, fla_not_usable_finding
from dflashdoctor.judges.kernel_resources import OutOfResources, out_of_resources_finding
from dflashdoctor.judges.raised_cause import explain_raised
from dflashdoctor.judges.tables import call_site_charts, call_site_table
from dflashdoctor.observations import DenseEvent, TraceAttentionObservations
from dflashdoctor.records import (
    FIX_REPLAY_PHASE,
    ErrorRecord,
    FixReplayRecord,
    FlaRefusal,
    FlaState,
    FlexSiteRecord,
    LayerRecord,
    ModuleSiteRecord,
    TracedDrafter,
    TracedModel,
    TracedScript,
)
from dflashdoctor.report import Finding, ProbeResult, Where

_FLEX = "flex_attention"
# How a call reached attention: through transformers' attention interface, transformers' compiled
# flex called from the user's own code (`compile_friendly_flex_attention`), a layer's own forward
# (a linear-attention layer), the user's compiled wrapper, flex_attention itself, or not at all (a
# layer the step never reached, listed from the module tree).
Path = Literal[
    "transformers-interface", "transformers-compiled", "module-forward", "compiled-wrapper", "raw-flex", "module-tree"
]
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


def _layer_tally(layers: list[LayerRecord]) -> str:
    """How many layers of each kind ran (or are set up to run) through each implementation."""
    tally = Counter((layer["kind"], layer["impl"]) for layer in layers)
    return ", ".join(f"{n} {kind} via {impl}" for (kind, impl), n in tally.items())


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


_OUTER_REGION = "inside an outer compiled region"
_WRAPPER_PATHS = ("compiled-wrapper", "transformers-compiled")  # a compiled flex whose own backend decides
_CARRIED = (
    *("file", "line", "function", "module", "calls", "compiled_into_graphs", "dense_forward", "dense_backward"),
    *("training", "backend"),
    *("q_shape", "kv_shape", "dtype", "mask", "mask_sparsity_pct", "score_matrix_bytes"),
    *("dense_forward_peak_bytes", "dense_backward_peak_bytes"),
)


def _row(site: Mapping[str, Any], *, origin: str, path: Path, via: str, impl: str, verdict: str) -> dict[str, Any]:
    """A report row: what the recorder saw, plus the judged origin, path, via and verdict. `path` and
    `in_outer_region` are what the judge reasons on; `via` is the same said for a reader.

    A call inside an outer compiled region runs no Python, so it is counted in graphs, not calls; the
    judge later claims the dense kernels whose stack passes through it.
    """
    row = {key: site.get(key) for key in _CARRIED}
    in_outer_region = bool(site.get("in_compiled_region"))
    if in_outer_region:
        via = f"{_OUTER_REGION} (backend {site.get('backend')}): {via}"
    return {
        **row,
        **{"origin": origin, "path": path, "in_outer_region": in_outer_region, "via": via, "impl": impl},
        **{"verdict": verdict, "cause": None},
    }


def _ran_dense(site: Mapping[str, Any]) -> bool:
    return bool(site.get("dense_forward") or site.get("dense_backward"))


_REPEATED_INDEX = re.compile(r"\.\d+\.")  # the block index of `layers.3.attention`


def _layer_shape(name: str) -> str:
    """`layers.N.attention` for `layers.3.attention`: the layers one block class repeats."""
    return _REPEATED_INDEX.sub(".N.", f".{name}.")


def call_site(site: ModuleSiteRecord) -> dict[str, Any]:
    """The report row of a call seen through transformers' attention interface or a module hook."""
    flex = site["impl"] == _FLEX
    path: Path = "module-forward" if site["impl"] == "module-forward" else "transformers-interface"
    if path == "module-forward":
        via = f"module forward ({site['module_class']})"
    elif flex and site.get("in_compiled_region"):
        # inside a compiled region transformers hands the raw flex_attention to the region's graph
        via = "transformers attention interface: flex_attention (raw, compiled by your region's backend)"
    elif flex:
        via = "transformers attention interface: flex_attention (HF's compiled singleton)"
    else:
        via = f"transformers attention interface: {site['impl']}"
    verdict = ("dense despite compile" if _ran_dense(site) else "fused") if flex else "not flex"
    origin = _origin(site.get("file")) if site.get("file") else "transformers"
    if path != "module-forward" and origin != "transformers":  # the caller's code, through transformers
        origin = f"{origin} via transformers"
    return _row(site, origin=origin, path=path, via=via, impl=site["impl"], verdict=verdict)


def user_site(site: FlexSiteRecord) -> dict[str, Any]:
    """The report row of a flex_attention call made through the user's own reference."""
    shown, more = site["wrapper_names"][:3], len(site["wrapper_names"]) - 3
    names = ", ".join(f"`{n}`" for n in shown) + (f" and {more} more" if more > 0 else "") or "an unnamed wrapper"
    path: Path
    if site["via"] == "compiled wrapper":
        path = "compiled-wrapper"
        via = f"user compiled wrapper {names} (torch.compile at {site['compiled_at']}, backend {site['backend']})"
        verdict = "dense despite compile" if _ran_dense(site) else "fused"
    elif site["via"] == "transformers compiled flex":
        path = "transformers-compiled"
        via = (
            "transformers' compiled flex_attention singleton, called from your code "
            f"(compile_friendly_flex_attention; torch.compile at {site['compiled_at']})"
        )
        verdict = "dense despite compile" if _ran_dense(site) else "fused"
    else:
        path = "raw-flex"
        via = "raw flex_attention" + ("" if site.get("in_compiled_region") else " (not compiled)")
        verdict = "dense" if _ran_dense(site) else "fused"
    if site.get("shared_graph_of"):
        via += f"; the compiled graph traced in {site['shared_graph_of']} (blocks compiled one by one share it)"
    row = _row(site, origin=_origin(site["file"]), path=path, via=via, impl=_FLEX, verdict=verdict)
    return {**row, "wrapper_names": site["wrapper_names"], "compiled_at": site.get("compiled_at")} | (
        {"rebound": site["rebound"]} if site.get("rebound") else {}
    )


def _route(row: dict[str, Any], events: list[DenseEvent]) -> str | None:
    """How the row's dense calls reached the kernel (flex_dense.ROUTES), from the events charged to it;
    a raw call outside any compiled region is raw whatever its events say."""
    if row["path"] == "raw-flex" and not row["in_outer_region"]:
        return "raw"
    routes = Counter(e.route for e in events if e.route)
    return routes.most_common(1)[0][0] if routes else None


def _charged(event: DenseEvent, row: dict[str, Any]) -> bool:
    """The event was charged to this row's site: by its forward call, or by its layer."""
    site = event.forward_site
    if site and (site["file"], site["line"], site.get("module")) == (row["file"], row["line"], row["module"]):
        return True
    return event.layer is not None and event.layer == row["module"]


_MERGED_KEYS = ("calls", "compiled_into_graphs", "dense_forward", "dense_backward")
_MAX_KEYS = ("score_matrix_bytes", "dense_forward_peak_bytes", "dense_backward_peak_bytes")


def _fold_twin(row: dict[str, Any], twin: dict[str, Any]) -> None:
    """`twin` is `row`'s layer seen again by another recorder: the calls are the same calls (the
    larger graph count stands), the dense kernels claimed by either are the layer's."""
    twin["compiled_into_graphs"] = max(twin["compiled_into_graphs"] or 0, row["compiled_into_graphs"] or 0)
    for direction in ("forward", "backward"):
        twin[f"dense_{direction}"] = max(twin[f"dense_{direction}"] or 0, row[f"dense_{direction}"] or 0)
    for name in _MAX_KEYS:
        values = [v for v in (twin.get(name), row.get(name)) if v is not None]
        twin[name] = max(values) if values else None
    if _ran_dense(twin) and twin["verdict"] == "fused":
        twin["verdict"] = "dense despite compile"
    if twin["origin"] == "transformers" and row.get("file") and _origin(row["file"]) != "transformers":
        # transformers' line is where every layer calls; the user's line that called in is the site
        twin.update(file=row["file"], line=row["line"], function=row["function"])
        twin["origin"] = f"{_origin(row['file'])} via transformers"


def _without_second_sightings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One layer seen by two recorders is one row.

    A layer's forward hook sees every call of an attention module; where a flex recorder saw the
    same module call flex_attention (a model calling transformers' compiled flex or a wrapper
    itself), the hook's row is that call seen again. Under `run` transformers binds the flex-call
    recorder's stand-in, so a layer traced into a compiled graph is also seen through the attention
    interface and as a raw call from transformers' own file; the interface row is the layer's. The
    second sighting is folded into the layer's row, with whatever dense kernels it claimed."""
    flex: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["impl"] == _FLEX and row["path"] != "module-forward" and row["module"]:
            known = flex.get(row["module"])
            if known is None or (row["path"] == "transformers-interface") > (known["path"] == "transformers-interface"):
                flex[row["module"]] = row
    kept = []
    for row in rows:
        twin = flex.get(row["module"])
        hook_twin = row["path"] == "module-forward"
        raw_twin = row["path"] == "raw-flex" and row["origin"] == "transformers" and twin is not row
        if twin is None or not (hook_twin or (raw_twin and twin["path"] == "transformers-interface")):
            kept.append(row)
            continue
        if raw_twin and _ran_dense(row):  # a dense raw call of transformers' file keeps its own row
            kept.append(row)
            continue
        _fold_twin(row, twin)
    return kept


def merge_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per layer (or per line, for module-less calls) and path: a layer traced into an outer
    graph and also called eagerly (after a fallback, or in another phase) is one row, with both counts."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in _without_second_sightings(rows):
        key = (
            row["path"],
            row["impl"],
            row["module"] or f"{row['file']}:{row['line']}",
            tuple(row.get("wrapper_names") or ()),
        )
        first = merged.get(key)
        if first is None:
            merged[key] = dict(row)
            continue
        for name in _MERGED_KEYS:
            first[name] = (first.get(name) or 0) + (row.get(name) or 0)
        for name in _MAX_KEYS:
            values = [v for v in (first.get(name), row.get(name)) if v is not None]
            first[name] = max(values) if values else None
        if row["in_outer_region"] and not first["in_outer_region"]:
            first.update(in_outer_region=True, backend=row["backend"], via=row["via"])
        if first["in_outer_region"] and first["calls"]:
            first["via"] = f"{first['via'].split(' and eagerly')[0]} and eagerly ({first['calls']} calls)"
        if _ran_dense(first):
            first["verdict"] = row["verdict"] if _ran_dense(row) else first["verdict"]
            if first["verdict"] == "fused":
                first["verdict"] = "dense despite compile"
    return list(merged.values())


def _memory_note(site: dict[str, Any], direction: str) -> str:
    note = f"Each dense call builds a float32 score matrix of {size_text(site['score_matrix_bytes'])}"
    peak = site.get(f"dense_{direction}_peak_bytes")
    if peak is not None:
        note += f"; the costliest dense {direction} kernel here raised CUDA memory by {size_text(peak)} at its peak"
    return note + "."


def _site_where(site: dict[str, Any]) -> Where:
    return Where(file=site["file"], line=site["line"], function=site["function"], module=site["module"])


def _same_call(first: DenseEvent, call: DenseEvent) -> bool:
    return (call.site, call.layer) == (first.site, first.layer)


def _belongs_to(event: DenseEvent, row: dict[str, Any]) -> bool:
    if event.layer is not None and row["module"] is not None:
        return bool(event.layer == row["module"])
    frame = (f"{row['file']}:", f" in {row['function']}")
    return event.kind == "forward" and any(s.startswith(frame[0]) and s.endswith(frame[1]) for s in event.stack)


def _replayed_call(record: FixReplayRecord) -> DenseEvent:
    """The dense forward a replay record was made from, as far as charging it to a row goes."""
    return DenseEvent(
        "forward",
        FIX_REPLAY_PHASE,
        [],
        [],
        "",
        record["device"],
        0,
        record["site"],
        stack=record["stack"],
        forward_site=record["forward_site"],
        layer=record["layer"],
    )


def fix_replay_text(record: FixReplayRecord | None) -> str:
    """The fix replayed on the user's own call, in one clause: proven only where the compiled call
    ran and no dense kernel fired during it (hooks/fix_replay.py decides; this only says it)."""
    if record is None:
        return "fix not proven: no dense forward call of this site was captured to replay"
    if not record["proven"]:
        return f"fix not proven: {record['reason']}"
    said = [f"fused ({record['dense_kernels']} dense kernels)"]
    direction = "forward/backward" if record["backward"] else "forward"
    fused = size_text(record["fused_peak_bytes"])
    if record["dense_out_of_memory"]:
        said.append(f"{direction} peak: the dense call ran out of memory, the fused one {fused}")
    elif record["dense_peak_bytes"] is not None and record["fused_peak_bytes"] is not None:
        said.append(f"{direction} peak {size_text(record['dense_peak_bytes'])} -> {fused}")
    elif record["device"].startswith("cpu"):
        said.append("forward only (on the CPU flex_attention has no backward and no peak is measured)")
    if record["max_abs_diff"] is not None:
        said.append(f"max |diff| {record['max_abs_diff']:.1g}")
    text = "fix proven on this call: " + ", ".join(said)
    if record["replayed_as"]:
        text += f" (the same call, shapes and mods, of {record['replayed_as']} was replayed)"
    return text


class TraceAttentionJudge(Judge):
    def __init__(self, observations: TraceAttentionObservations, budgets: Budgets) -> None:
        super().__init__("trace-attention", budgets)
        self.observations = observations
        self.model = observations.traced_model
        self.script = observations.traced_script
        self.drafter = observations.traced_drafter
        parts = observations.parts()
        self.sites = [call_site(s) for part in parts for s in part["sites"]]
        traced_code = [p for p in (self.drafter, self.script) if p]  # the parts whose own code calls flex
        self.sites += [user_site(s) for part in traced_code for s in part["flex_sites"]]
        # the kernels the fix replay ran itself are no call of the user's
        self.dense_events = [e for e in observations.dense_events if e.phase != FIX_REPLAY_PHASE]
        self.unclaimed = [e for e in self.dense_events if not e.forward_site]
        self.sites += self._rows_for_shared_graphs()
        self._claim_outer_region_events()
        self.sites = merge_rows(self.sites)
        self._layers_from_the_tree()
        self.compile_calls = CompileCall.read([c for part in traced_code for c in part["compile_calls"]])
        self.causes: dict[int, Cause] = {}
        for row in self.sites:
            if row["impl"] == _FLEX and _ran_dense(row):
                cause = self._cause(row)
                self.causes[id(row)] = cause
                row["cause"], row["cause_kind"] = cause.summary, cause.kind

    def _cause(self, row: dict[str, Any]) -> Cause:
        events = [e for e in self.dense_events if _charged(e, row)]
        call = DenseCall(
            route=_route(row, events),
            backend=row.get("backend"),
            in_outer_region=row["in_outer_region"],
            wrapper_backend=row.get("backend")
            if row["path"] in ("compiled-wrapper", "transformers-compiled")
            else None,
            wrapper_compiled_at=row.get("compiled_at"),
            rebound=row.get("rebound"),
            known_file=row.get("file"),
            disabled_at=next((e.disabled_at for e in events if e.disabled_at), None),
            stance=next((e.stance for e in events if e.stance), None),
            recomputed=next((e.recomputed for e in events if e.recomputed), None),
            site_at=f"{row['file']}:{row['line']}" if row.get("file") else None,
            stance_set_at=next((e.stance_set_at for e in events if e.stance_set_at), None),
        )
        return explain(
            call, self.observations.compiles, self.compile_calls, dynamo_disabled=self.observations.dynamo_disabled
        )

    def _rows_for_shared_graphs(self) -> list[dict[str, Any]]:
        """Blocks compiled one by one (torchtitan's per-block compile) share one traced graph: its
        flex call is seen at trace time in the first block only, while the dense kernels of every
        block name their own layer. A layer with dense kernels and no row of its own gets the row of
        the traced layer it repeats (`layers.1.attention` of `layers.0.attention`), so each block is
        one row and its kernels are charged to it."""
        rows = {row["module"] for row in self.sites if row["module"]}
        made: list[dict[str, Any]] = []
        for layer in dict.fromkeys(e.layer for e in self.unclaimed if e.layer and e.layer not in rows):
            assert layer is not None
            shape = _layer_shape(layer)
            outer = [r for r in self.sites if r["module"] and r["in_outer_region"]]
            twin = next((r for r in outer if _layer_shape(r["module"]) == shape), None)
            if twin is not None:
                row = {**twin, "module": layer, "dense_forward": 0, "dense_backward": 0, "verdict": "fused"}
                made.append(row)
        return made

    def _claim_outer_region_events(self) -> None:
        """Dense kernels run from inside an outer compiled graph belong to the site of their layer
        (the graph node's module, which the dense hook names), else to the site whose file and
        function are on their stack (a graph of a module-less function runs in the user's frame).
        Several layers share one line of code, so the stack alone would charge them all to one."""
        for row in self.sites:
            if not row["in_outer_region"]:
                continue
            mine = [e for e in self.unclaimed if _belongs_to(e, row)]
            for direction in ("forward", "backward"):
                events = [e for e in mine if e.kind == direction]
                if not events:
                    continue
                row[f"dense_{direction}"] += len(events)
                row["score_matrix_bytes"] = max(row["score_matrix_bytes"] or 0, *(e.score_matrix_bytes for e in events))
                peaks = [e.peak_bytes for e in events if e.peak_bytes is not None]
                row[f"dense_{direction}_peak_bytes"] = max(peaks) if peaks else row[f"dense_{direction}_peak_bytes"]
                row["verdict"] = "dense despite compile"
            self.unclaimed = [e for e in self.unclaimed if e not in mine]

    def judge(self) -> ProbeResult:
        self._instrumentation()
        if self.model:
            self._model(self.model)
            self._layers(self.model)
        if self.drafter:
            self._drafter(self.drafter)
        if self.script:
            self._script(self.script)
        self._flex_sites()
        self._unclaimed_dense()
        self._graph_breaks()
        self._bypasses()
        self.measurements["call_sites"] = self.sites + self._layers_not_run()
        if self.observations.fix_replays:
            self.measurements["fix_replays"] = self.observations.fix_replays
        self.tables.append(call_site_table(self.measurements["call_sites"]))
        self.comparisons += call_site_charts(self.measurements["call_sites"])
        return self.result()

    def _layers_from_the_tree(self) -> None:
        """A layer hook sees that a layer ran, not which kernel: its row takes the implementation the
        probe read from the layer (the FLA kernel or transformers' torch fallback)."""
        ran = {layer["module"]: layer for layer, _ in self._listed_layers() if layer.get("ran")}
        for row in self.sites:
            layer = ran.get(row["module"])
            if layer is not None and row["impl"] == "module-forward":
                row["impl"] = layer["impl"]
                row["via"] = f"{row['via']}: {layer['impl']}"  # after the outer region's words, if any

    def _layers_not_run(self) -> list[dict[str, Any]]:
        """The layers a raising step never reached, as the module tree configures them, so that the
        table still lists every layer; they are no call site, so no check counts them."""
        return [
            _row(
                {"module": layer["module"], "calls": 0},
                origin="transformers",
                path="module-tree",
                via=f"module tree ({layer['class']}): configured {layer['configured']}",
                impl=layer["configured"],
                verdict=f"did not run: {why}",
            )
            for layer, why in self._listed_layers()
            if not layer.get("ran")
        ]

    def _listed_layers(self) -> list[tuple[LayerRecord, str]]:
        """Every attention layer read from a module tree: the model's, then those of the transformers
        models the script built; each with why it would not have run."""
        model = [(layer, "the step stopped before it") for layer in (self.model["layers"] if self.model else [])]
        return model + [
            (layer, "not reached in the script") for layer in (self.script["layers"] if self.script else [])
        ]

    def _instrumentation(self) -> None:
        parts = self.observations.parts()
        unavailable = [part["hook_unavailable"] for part in parts] + [self.observations.hook_unavailable]
        reasons = sorted({reason for reason in unavailable if reason})
        for reason in reasons:
            self.findings.append(
                finding(
                    "instrumentation-unavailable",
                    "Part of the tracing could not be installed on this torch/transformers",
                    detail=reason,
                    fix="Report the versions to dflashdoctor; the sites seen by the other recorders are still listed.",
                )
            )

    def _model(self, model: TracedModel) -> None:
        self.measurements.update(
            {
                key: model[key]
                for key in ("model", "model_class", "scale", "parameters", "attn_implementation", "seq_len", "backward")
            }
        )
        steps = "forward and backward" if model["backward"] else f"forward only ({model['no_backward']})"
        self._check(
            "model",
            "info",
            f"{model['model_class']} ({model['model_type']}, {count_text(model['parameters'])} parameters, "
            f"{model['scale']} scale, attention {model['attn_implementation']}), {steps}",
        )
        fla = model["fla"]
        if fla and not fla["usable"]:
            self.findings.append(fla_not_usable_finding(fla, traced=True))
        if model["fla_refused"]:
            self._fla_refused(model["fla_refused"], fla)
        if model["error"]:
            self._raised("model step", f"the {model['model']} model step", model["error"], None)

    def _fla_refused(self, refused: FlaRefusal, fla: FlaState | None, check: str = "model step") -> None:
        """FLA's own guard stopped the step (a model's or a script's): this machine's versions, not
        the code."""
        guard = refused["guard"]
        self.findings.append(fla_guard_finding(guard, fla, during=refused["stage"]))
        self._check(
            check,
            "warn",
            f"FLA refuses `{guard['function']}` on this machine; {refused['stage']} stopped there",
            "kernel-unavailable",
        )

    def _layers(self, model: TracedModel) -> None:
        layers = model["layers"]
        self.measurements["layers"] = layers
        summary = _layer_tally(layers)
        ran = sum(1 for layer in layers if layer.get("ran"))
        ran_text = "all ran" if ran == len(layers) else f"{ran} ran before the step stopped; the rest as configured"
        self._check("layers", "info", f"{len(layers)} attention layers ({ran_text}): {summary}")
        refused = model["flex_refused"]
        if not refused:
            return
        model_class = model["model_class"]
        self.findings.append(
            finding(
                "flex-unsupported-model",
                f"{model_class} cannot use flex_attention",
                detail=(
                    f"transformers refuses attn_implementation='flex_attention' for this class ({refused}). "
                    f"Its layers run instead: {summary}. Any flex_attention in this pipeline lives "
                    "elsewhere: in the drafter and in your own code."
                ),
                evidence={"refusal": refused, "layers": layers},
                fix="Trace the drafter and your training script rather than this model (`--script`); check "
                "your flex_attention entry with `dflashdoctor check-compile`.",
            )
        )
        self._check("flex support", "info", f"{model_class} refuses flex_attention", "flex-unsupported-model")

    def _drafter(self, drafter: TracedDrafter) -> None:
        fault = drafter["fault"] or "none"
        self.measurements["drafter"] = {k: drafter[k] for k in ("fault", "scale", "backward", "q_len", "context_len")}
        steps = "forward and backward" if drafter["backward"] else "forward only (no flex backward on CPU)"
        what = (
            f"reference DFlash drafter step, {drafter['scale']} scale, {drafter['q_len']} draft tokens over "
            f"{drafter['context_len']} context, {steps}, fault {fault}"
        )
        if drafter["error"]:
            self._raised("drafter", "the reference drafter step", drafter["error"], None)
        else:
            self._check("drafter", "info", what)

    def _script(self, script: TracedScript) -> None:
        self.measurements["script"] = script["script"]
        self._script_layers(script["layers"])
        if self._script_fla(script):
            return
        if script["error"]:
            self._raised("script", script["script"], script["error"], Where(file=script["script"]))
        else:
            self._check("script", "pass", f"{script['script']} ran to the end")

    def _script_layers(self, layers: list[LayerRecord]) -> None:
        """The attention layers of the transformers models the script built, listed as a preset's are."""
        if not layers:
            return
        self.measurements["script_layers"] = layers
        ran = sum(1 for layer in layers if layer.get("ran"))
        ran_text = "all ran" if ran == len(layers) else f"{ran} ran"
        self._check(
            "script layers",
            "info",
            f"{len(layers)} attention layers in the models the script built ({ran_text}): {_layer_tally(layers)}",
        )

    def _script_fla(self, script: TracedScript) -> bool:
        """FLA as the script met it, diagnosed as for a preset: installed where its kernels cannot run
        (the trace kept it out; said once when the model part says it too), the script's own import
        of FLA stopped by that, or FLA's own guard refusing a kernel here. True when that is why the
        script stopped: the environment, not the script, so no `target-raised`."""
        fla = script["fla"]
        stopped = script["fla_import_stopped"]
        refused = script["fla_refused"]
        model_fla = self.model["fla"] if self.model else None
        if stopped and fla:
            self.findings.append(fla_import_stopped_finding(stopped, fla))
            self._check(
                "script",
                "warn",
                f"{script['script']} stopped at its own import of FLA, kept out here",
                "kernel-unavailable",
            )
        elif refused:
            self._fla_refused(refused, fla, check="script")
        elif fla and not fla["usable"] and not (model_fla and not model_fla["usable"]):
            self.findings.append(fla_not_usable_finding(fla, traced=True))
        return bool(stopped or refused)

    def _raised(self, check: str, what: str, error: ErrorRecord, where: Where | None) -> None:
        resources = OutOfResources.read(error["message"], error.get("traceback") or "")
        if resources is not None:
            self.findings.append(out_of_resources_finding(resources, what, where))
            self._check(
                check, "fail", f"a kernel does not fit this GPU ({resources.resource})", "kernel-out-of-resources"
            )
            return
        first_line = (error["message"].strip().splitlines() or [""])[0]
        cause = explain_raised(
            error, self.observations.compiles, self.compile_calls, where.file if where is not None else None
        )
        self.findings.append(
            finding(
                "target-raised",
                f"{what} raised {error['type']}: {cause.summary}"
                if cause
                else f"{what} raised {error['type']}; the sites seen before it are kept",
                detail=f"{error['type']}: {first_line}"
                + (f". Cause ({cause.kind}): {cause.summary}." if cause else "")
                + (f" The line to change: {cause.where.file}:{cause.where.line}." if cause and cause.where else ""),
                where=(cause.where if cause and cause.where else where),
                evidence={**error, "cause_kind": cause.kind} if cause else dict(error),
                fix=cause.fix
                if cause
                else "Run it by hand to see the failure; the call sites listed were recorded before it.",
            )
        )
        self._check(check, "fail", f"{what} raised {error['type']}", "target-raised")

    def _graph_breaks(self) -> None:
        breaks = self.observations.graph_breaks
        self.measurements.update(graph_breaks=sum(breaks.values()), graph_break_reasons=breaks)
        self._graph_break_check(breaks, "in the traced run")

    def _unclaimed_dense(self) -> None:
        """Dense kernels no recorded call site claimed (a call no recorder sees, such as one through
        a reference bound before tracing started): one finding per direction, with the phase and
        the first frame outside torch, if any."""
        for direction in ("forward", "backward"):
            events = [e for e in self.unclaimed if e.kind == direction]
            if not events:
                continue
            first = events[0]
            replay = self._fix_replay(partial(_same_call, first))
            self.findings.append(
                finding(
                    f"dense-{direction}",
                    f"flex_attention {direction} ran the dense kernel {len(events)} times for calls no recorder saw",
                    detail=(
                        f"First in {first.phase} for q {first.q_shape} kv {first.kv_shape} {first.dtype}, "
                        f"building a float32 score matrix of {size_text(first.score_matrix_bytes)} per call. Likely "
                        "causes: a flex_attention reference bound before tracing started, or a call inside a "
                        "compiled region the recorders could not see."
                    )
                    + self._fix_replay_note(replay),
                    where=Where(**first.site) if first.site else None,
                    evidence={f"dense_{direction}_calls": len(events), "events": [e.to_dict() for e in events[:8]]},
                    fix="Call flex_attention through a wrapper compiled once with the default (Inductor) backend; "
                    "a fused forward under torch.compile also fuses its backward.",
                )
            )

    def _dense_site_findings(self, site: dict[str, Any]) -> None:
        """One finding per dense direction of a site, with its cause and what it cost."""
        name = site["module"] or site["function"]
        cause = self.causes[id(site)]
        called = "" if site["in_outer_region"] else "through "

        def belongs(call: DenseEvent) -> bool:
            return _charged(call, site) or _belongs_to(call, site)

        replay = self._fix_replay(belongs)
        for direction in ("forward", "backward"):
            count = site[f"dense_{direction}"]
            if not count:
                continue
            of_calls = direction == "forward" and site["calls"]
            times = f"{count} of {site['calls']} calls" if of_calls else f"{count} times"
            self.findings.append(
                finding(
                    f"dense-{direction}",
                    f"{name}: flex_attention {direction} ran the dense kernel ({times})",
                    detail=f"Called {called}{site['via']}. Cause: {cause.summary}. {_memory_note(site, direction)} "
                    f"Verdict: {site['verdict']}."
                    + (f" The line to change: {cause.where.file}:{cause.where.line}." if cause.where else "")
                    + self._fix_replay_note(replay),
                    where=_site_where(site),
                    evidence=site if replay is None else {**site, "fix_replay": replay},
                    fix=cause.fix,
                )
            )

    def _fix_replay(self, belongs: Callable[[DenseEvent], bool]) -> FixReplayRecord | None:
        """The replay of a call that `belongs` to the site or finding, if one was made."""
        replays = self.observations.fix_replays or []
        return next((r for r in replays if belongs(_replayed_call(r))), None)

    def _fix_replay_note(self, replay: FixReplayRecord | None) -> str:
        """The sentence a dense finding ends with: nothing where no replay was tried (`run`, or
        observations recorded before the replay)."""
        if self.observations.fix_replays is None:
            return ""
        text = fix_replay_text(replay)
        return f" Replayed through torch.compile(flex_attention) (Inductor) after the run: {text.rstrip('.')}."

    def _flex_sites(self) -> None:
        flex = [s for s in self.sites if s["impl"] == _FLEX]
        if not flex:
            return
        hf = [s for s in flex if s["path"] == "transformers-interface"]
        if hf:
            self.findings.append(self._hf_path_note(hf))
        dense = [s for s in flex if _ran_dense(s)]
        for site in dense:
            self._dense_site_findings(site)
        self._repeat_kv(hf)
        calls = sum(s["calls"] for s in flex)
        in_graphs = sum(s["in_outer_region"] for s in flex)
        self._check(
            "flex calls",
            "fail" if dense else "pass",
            f"{len(flex)} sites{f' ({in_graphs} inside compiled graphs)' if in_graphs else ''}, {calls} calls seen: "
            f"{len(dense)} sites dense, {len(flex) - len(dense)} fused",
            "dense-forward",
            "dense-backward",
            "hf-internal-flex-path",
        )

    @staticmethod
    def _hf_path_note(hf: list[dict[str, Any]]) -> Finding:
        """transformers compiles flex_attention itself only outside a compiled region: inside the
        user's, it hands the raw function to the user's graph, whose backend decides."""
        modules = list(dict.fromkeys(s["module"] for s in hf))
        named = ", ".join(modules[:8]) + (" ..." if len(modules) > 8 else "")
        inside = [s for s in hf if s["in_outer_region"]]
        if inside:
            backends = ", ".join(sorted({str(s["backend"]) for s in inside}))
            detail = (
                "These calls go through transformers.integrations.flex_attention. Inside your compiled region "
                "transformers passes the raw flex_attention to your graph (its own compiled singleton is used "
                f"only outside torch.compile), so your torch.compile (backend {backends}) compiles them: {named}"
            )
            fix = "Nothing to change on this path itself: your model's torch.compile decides whether these calls fuse."
        else:
            detail = (
                "These calls go through transformers.integrations.flex_attention, which compiles flex_attention "
                f"itself, not through a wrapper of yours: {named}"
            )
            fix = _HF_FLEX_FIX
        return finding(
            "hf-internal-flex-path",
            f"{len(modules)} layers call flex_attention through transformers' own integration",
            detail=detail,
            where=_site_where(hf[0]),
            evidence={"modules": modules},
            fix=fix,
        )

    def _bypasses(self) -> None:
        expected = self.observations.expect_wrapper
        if not expected:
            return
        module_part, _, attr = expected.rpartition(":")
        if module_part.endswith(".py"):
            module_part = os.path.abspath(module_part)
        wanted = f"{module_part}:{attr}"
        flex = [s for s in self.sites if s["impl"] == _FLEX]
        through = [s for s in flex if wanted in s.get("wrapper_names", [])]
        bypass = [s for s in flex if s not in through]
        if bypass:
            self.findings.append(
                finding(
                    "bypasses-wrapper",
                    f"{len(bypass)} flex_attention call sites do not go through `{expected}`",
                    detail="These calls reach flex_attention some other way: "
                    + "; ".join(f"{s['module'] or s['function']} via {s['via']}" for s in bypass[:8])
                    + (" ..." if len(bypass) > 8 else ""),
                    where=_site_where(bypass[0]),
                    evidence={"expected": wanted, "sites": bypass},
                    fix=f"Route these calls through `{expected}`; for a transformers model, register it: "
                    "`AttentionInterface.register('flex_attention', ...)` with a function that calls it.",
                )
            )
        self._check(
            "expected wrapper",
            "fail" if bypass else "pass",
            f"{len(through)} of {len(flex)} flex sites go through {expected}",
            "bypasses-wrapper",
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


def judge(observations: TraceAttentionObservations, budgets: Budgets) -> list[ProbeResult]:
    return [TraceAttentionJudge(observations, budgets).judge()]
