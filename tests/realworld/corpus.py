"""The real-code corpus: each case a script written after public training code (its source named in
the script and here), with the answer a user needs, established without dflashdoctor: which layers
run dense (torch.profiler in ground_truth.py counts the dense kernel's own op), why (dynamo's records
and reading the code), the fix that works and the user's line it changes.

One list serves the tests (tests/integration/test_realworld.py asserts every case on all five
dimensions) and the scoreboard (benchmarks/accuracy.py prints the share right per dimension).

The five dimensions, scored from `trace-attention --script CASE --json`:
- verdict: the exit code (1 when something runs dense or the script raises, else 0);
- sites: the dense flex rows are exactly the dense layers, and no dense layer is listed fused;
- cause: every dense row (or the raised error) has the case's cause kind;
- fix: every dense (or raised) finding's fix says each of the case's phrases;
- line: the finding names the user's line to change (`script:line`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
DIMENSIONS = ("verdict", "sites", "cause", "fix", "line")
LLAMA_LAYERS = frozenset({"model.layers.0.self_attn", "model.layers.1.self_attn"})
TITAN_LAYERS = frozenset({"layers.0.attention", "layers.1.attention"})


def line_of(script: str, text: str) -> int:
    """The line of a case script that starts with `text` (docstrings quote the same code)."""
    lines = (HERE / script).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(text))


@dataclass(frozen=True)
class Case:
    script: str
    args: tuple[str, ...] = ()
    source: str = ""  # repo@commit (file) or package==version the script follows
    dense_layers: frozenset[str] = frozenset()  # the rows (module, or function) that must run dense
    fused_layers: frozenset[str] = frozenset()  # the rows that must be listed fused
    cause: str | None = None  # the cause kind of every dense row, or of the raised error
    raises: bool = False  # the script ends in an error (the cause is the error's)
    fix_says: tuple[str, ...] = ()  # what the fix must name
    change: tuple[str, str] | None = None  # (file, start of the line) a user edits
    gpu_args: tuple[str, ...] | None = None  # the arguments on a GPU (forward and backward); None: CPU only
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return "-".join([self.script.removesuffix(".py"), *(a.lstrip("-") for a in self.args)]) or self.script

    @property
    def change_at(self) -> str | None:
        if self.change is None:
            return None
        return f"{self.change[0]}:{line_of(*self.change)}"

    @property
    def faulty(self) -> bool:
        return bool(self.dense_layers) or self.raises


def _name(row: dict[str, Any]) -> str:
    return row["module"] or row["function"]


def flex_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    (result,) = report["results"]
    return [row for row in result["measurements"]["call_sites"] if row["impl"] == "flex_attention"]


def findings(report: dict[str, Any], *codes: str) -> list[dict[str, Any]]:
    return [f for r in report["results"] for f in r["findings"] if f["code"] in codes]


def score(case: Case, exit_code: int, report: dict[str, Any] | None) -> dict[str, bool]:
    """Each dimension right or wrong for one run of the tool on the case."""
    if report is None:
        return dict.fromkeys(DIMENSIONS, False)
    rows = flex_rows(report)
    dense = {_name(r) for r in rows if r["dense_forward"] or r["dense_backward"]}
    fused = {_name(r) for r in rows if r["verdict"] == "fused"}
    told = findings(report, "target-raised") if case.raises else findings(report, "dense-forward", "dense-backward")
    if case.raises:
        kinds = {(f.get("evidence") or {}).get("cause_kind") for f in told}
    else:
        kinds = {r.get("cause_kind") for r in rows if _name(r) in dense}
    place = case.change_at
    return {
        "verdict": exit_code == (1 if case.faulty else 0),
        "sites": dense == set(case.dense_layers) and fused >= set(case.fused_layers) and not fused & dense,
        "cause": (kinds == {case.cause} and bool(told)) if case.faulty else not told,
        "fix": all(all(text in (f.get("fix") or "") for text in case.fix_says) for f in told) and bool(told)
        if case.faulty
        else True,
        "line": bool(told) and all(_names_line(f, place) for f in told) if place else True,
    }


def _names_line(found: dict[str, Any], place: str) -> bool:
    where = found.get("where") or {}
    at = f"{where.get('file')}:{where.get('line')}"
    return at.endswith(place) or place in (found.get("detail") or "")


HF_BACKEND = Case(
    "hf_llama_compiled.py",
    ("--backend", "aot_eager"),
    source="transformers==5.25.0 (LlamaForCausalLM, attn_implementation='flex_attention')",
    dense_layers=LLAMA_LAYERS,
    cause="model-backend",
    fix_says=("backend='aot_eager'", "torch.compile(model)", "does not help"),
    change=("hf_llama_compiled.py", "model = torch.compile(model, backend=args.backend)"),
    gpu_args=("--backend", "aot_eager", "--device", "cuda", "--train", "--seq", "2048"),
)

CASES: list[Case] = [
    HF_BACKEND,
    Case("hf_llama_compiled.py", source=HF_BACKEND.source, fused_layers=LLAMA_LAYERS),
    Case(
        "hf_llama_compiled.py",
        ("--static", "--grow"),
        source=HF_BACKEND.source,
        dense_layers=LLAMA_LAYERS,
        cause="recompile-limit-static-shapes",
        fix_says=("dynamic=False", "mark_dynamic", "pad lengths"),
        change=("hf_llama_compiled.py", "model = torch.compile(model, backend=args.backend, dynamic=False)"),
    ),
    Case("hf_llama_compiled.py", ("--grow",), source=HF_BACKEND.source, fused_layers=LLAMA_LAYERS),
    Case(
        "packed_static.py",
        source="pytorch/torchtune==0.6.1 (torchtune/modules/attention_utils.py)",
        dense_layers=frozenset({"compile_friendly_flex_attention"}),
        cause="recompile-limit-static-shapes",
        fix_says=("Drop `dynamic=False`", "torch.compile(flex_attention"),
        change=("packed_static.py", "flex_attention_compiled = torch.compile(flex_attention, dynamic"),
    ),
    Case(
        "packed_static.py",
        ("--dynamic",),
        source="pytorch/torchtune==0.6.1 (torchtune/modules/attention_utils.py)",
        fused_layers=frozenset({"compile_friendly_flex_attention"}),
    ),
    Case(
        "prefix_lm_global.py",
        source="meta-pytorch/attention-gym (attn_gym/masks/prefix_lm.py)",
        dense_layers=frozenset({"<module>"}),
        cause="recompile-limit-global",
        fix_says=("PREFIX_LENGTH", "tensor"),
        change=("prefix_lm_global.py", "return torch.where((kv_idx <= q_idx) | (kv_idx < PREFIX_LENGTH)"),
    ),
    Case(
        "prefix_lm_global.py",
        ("--tensor",),
        source="meta-pytorch/attention-gym (attn_gym/masks/prefix_lm.py)",
        fused_layers=frozenset({"<module>"}),
    ),
    Case(
        "titan_rebound.py",
        ("--rebind",),
        source="pytorch/torchtitan@0012170a0708b751408e6085f970082ecd678d2b (torchtitan/models/attention.py)",
        dense_layers=TITAN_LAYERS,
        cause="rebound-wrapper",
        fix_says=("Remove the rebinding", "FlexAttentionWrapper._compiled_flex_attn"),
        change=("titan_rebound.py", "FlexAttentionWrapper._compiled_flex_attn = flex_attention"),
        gpu_args=("--rebind", "--device", "cuda"),
    ),
    Case(
        "titan_rebound.py",
        source="pytorch/torchtitan@0012170a0708b751408e6085f970082ecd678d2b (torchtitan/models/attention.py)",
        fused_layers=TITAN_LAYERS,
    ),
]
