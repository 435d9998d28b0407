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


def line_of(script: str, text: str, after: str = "") -> int:
    """The line of a case script that starts with `text` (docstrings quote the same code), the
    first after the line that starts with `after` when the same text is on two lines."""
    lines = (HERE / script).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.strip().startswith(after)) if after else 0
    return next(i for i, line in enumerate(lines, 1) if i > start and line.strip().startswith(text))


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
    change: tuple[str, ...] | None = None  # (file, start of the line a user edits[, the line it follows])
    also_change: tuple[str, ...] | None = None  # another line the same edit touches, as good an answer
    gpu_args: tuple[str, ...] | None = None  # the arguments on a GPU (forward and backward); None: CPU only
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return "-".join([Path(self.script).stem, *(a.lstrip("-") for a in self.args)])

    @property
    def change_at(self) -> str | None:
        if self.change is None:
            return None
        return f"{Path(self.change[0]).name}:{line_of(*self.change)}"

    @property
    def also_change_at(self) -> str | None:
        return f"{Path(self.also_change[0]).name}:{line_of(*self.also_change)}" if self.also_change else None

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
    place, also = case.change_at, case.also_change_at
    return {
        "verdict": exit_code == (1 if case.faulty else 0),
        "sites": dense == set(case.dense_layers) and fused >= set(case.fused_layers) and not fused & dense,
        "cause": (kinds == {case.cause} and bool(told)) if case.faulty else not told,
        "fix": all(all(text in (f.get("fix") or "") for text in case.fix_says) for f in told) and bool(told)
        if case.faulty
        else True,
        "line": bool(told) and all(_names_line(f, place) or (also and _names_line(f, also)) for f in told)
        if place
        else True,
    }


def _names_line(found: dict[str, Any], place: str) -> bool:
    where = found.get("where") or {}
    at = f"{where.get('file')}:{where.get('line')}"
    return at.endswith(f"/{place}") or at == place or f"/{place}" in (found.get("detail") or "")


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


TITAN_BLOCKS = "pytorch/torchtitan@177b050ca1c5 (torchtitan/models/llama3/infra/parallelize.py, apply_compile)"
TITAN_INNER = frozenset({"layers.0.attention.inner_attention", "layers.1.attention.inner_attention"})
TUNE_DISABLE = "pytorch/torchtune@1e1ef022e079 (torchtune/modules/attention_utils.py)"
TUNE_LAYERS = frozenset({"layers.0.attn", "layers.1.attn"})
GYM_SOFTCAP = "meta-pytorch/attention-gym@7fdb85d0b966 (attn_gym/mods/softcapping.py)"
TWO_LAYERS = frozenset({"layers.0", "layers.1"})
TITAN_DETERMINISM = "pytorch/torchtitan@06562f393dba (torchtitan/distributed/utils.py, set_determinism)"
HF_MASK = "transformers==5.25.0 (masking_utils.py flex_attention_mask, create_block_mask(_compile=True))"
HF_TRAINER = "accelerate==1.16.0 (accelerator.py prepare_model) under transformers==5.25.0 Trainer"
FACTORY_CHECKPOINT = "hiyouga/LLaMA-Factory@06d78ff17112 (model_utils/checkpointing.py, use_reentrant=True)"
ACCELERATE = "accelerate==1.16.0 (accelerator.py prepare_model, TorchDynamoPlugin)"
NANOGPT_DDP = "karpathy/nanoGPT@e2221318 (train.py: torch.compile(model), then DDP)"
DDP_LAYERS = frozenset({"module.h.0.attn", "module.h.1.attn"})
SPECFORGE = "sgl-project/SpecForge (the DFlash drafter, benchmarks/held_out_drafter.py)"
DRAFTER = "../../benchmarks/held_out_drafter.py"
DRAFTER_LAYERS = frozenset(f"layers.{i}.self_attn" for i in range(4))
TINY_DRAFTER = (
    *("--device", "cpu", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"),
    *("--intermediate", "128", "--vocab", "256", "--context", "128", "--blocks", "4", "--steps", "3", "--warmup", "1"),
)
GPU_TRAIN = ("--device", "cuda", "--train", "--seq", "2048")

CASES += [
    Case(
        "titan_per_block.py",
        ("--backend", "aot_eager"),
        source=TITAN_BLOCKS,
        dense_layers=TITAN_INNER,
        cause="model-backend",
        fix_says=("aot_eager", "does not help"),
        change=("titan_per_block.py", "transformer_block.compile(backend=backend"),
        gpu_args=("--backend", "aot_eager", *GPU_TRAIN),
    ),
    Case(
        "titan_per_block.py",
        ("--backend", "aot_eager", "--style", "replace"),
        source=TITAN_BLOCKS,
        dense_layers=TITAN_INNER,
        cause="model-backend",
        fix_says=("aot_eager", "does not help"),
        change=("titan_per_block.py", "transformer_block = torch.compile(transformer_block, backend=backend"),
    ),
    Case("titan_per_block.py", ("--backend", "inductor"), source=TITAN_BLOCKS, fused_layers=TITAN_INNER),
    Case(
        "titan_per_block.py",
        ("--backend", "inductor", "--style", "replace"),
        source=TITAN_BLOCKS,
        fused_layers=TITAN_INNER,
    ),
    Case("titan_per_block.py", ("--backend", "aot_eager", "--regional"), source=TITAN_BLOCKS, fused_layers=TITAN_INNER),
    Case(
        "disable_helper.py",
        ("--helper", "disabled"),
        source=TUNE_DISABLE,
        dense_layers=TUNE_LAYERS,
        cause="disabled-region",
        fix_says=("Remove `@torch.compiler.disable`",),
        change=("disable_helper.py", "@torch.compiler.disable"),
        gpu_args=("--helper", "disabled", *GPU_TRAIN),
    ),
    Case("disable_helper.py", ("--helper", "plain"), source=TUNE_DISABLE, fused_layers=TUNE_LAYERS),
    Case("disable_helper.py", ("--helper", "torchtune"), source=TUNE_DISABLE, fused_layers=TUNE_LAYERS),
    Case("disable_helper.py", ("--helper", "shallow"), source=TUNE_DISABLE, fused_layers=TUNE_LAYERS),
    Case(
        "annealed_softcap.py",
        source=GYM_SOFTCAP,
        raises=True,
        cause="changing-float",
        fix_says=("0-d tensor", "fill_"),
        change=("annealed_softcap.py", "cap = self.soft_cap_tensor if args.tensor"),
        also_change=("annealed_softcap.py", "out = flex_attention(q.sin(), k.sin(), v, score_mod=generate_tanh"),
        gpu_args=GPU_TRAIN,
    ),
    Case(
        "annealed_softcap.py",
        ("--static",),
        source=GYM_SOFTCAP,
        dense_layers=TWO_LAYERS,
        cause="changing-float",
        fix_says=("0-d tensor", "fill_"),
        change=("annealed_softcap.py", "cap = self.soft_cap_tensor if args.tensor"),
        also_change=("annealed_softcap.py", "out = flex_attention(q.sin(), k.sin(), v, score_mod=generate_tanh"),
        gpu_args=("--static", *GPU_TRAIN),
    ),
    Case("annealed_softcap.py", ("--tensor",), source=GYM_SOFTCAP, fused_layers=TWO_LAYERS),
    Case(
        "launcher_rebound.py",
        ("--rebind", "launcher"),
        source=TITAN_DETERMINISM,
        dense_layers=TITAN_INNER,
        cause="rebound-wrapper",
        fix_says=("Remove the rebinding", "FlexAttention._compiled_flex_attn"),
        change=("launcher_rebound.py", "FlexAttention._compiled_flex_attn = flex_attention", 'if args.rebind == "'),
    ),
    Case(
        "launcher_rebound.py",
        ("--rebind", "exec"),
        source=TITAN_DETERMINISM,
        dense_layers=TITAN_INNER,
        cause="rebound-wrapper",
        fix_says=("Remove the rebinding",),
        change=("launcher_rebound.py", "exec(DETERMINISM_PATCH"),
    ),
    Case(
        "launcher_rebound.py",
        ("--rebind", "runpy"),
        source=TITAN_DETERMINISM,
        dense_layers=TITAN_INNER,
        cause="rebound-wrapper",
        fix_says=("Remove the rebinding",),
        change=("titan_determinism_patch.py", "FlexAttention._compiled_flex_attn = flex_attention"),
    ),
    Case("launcher_rebound.py", source=TITAN_DETERMINISM, fused_layers=TITAN_INNER),
    Case(
        "hf_fullgraph.py",
        source=HF_MASK,
        raises=True,
        cause="fullgraph-break",
        fix_says=("ignore_logging_functions", "fullgraph=True"),
        change=("hf_fullgraph.py", "model = torch.compile(model, backend=args.backend, fullgraph=True)"),
        gpu_args=GPU_TRAIN,
    ),
    Case("hf_fullgraph.py", ("--no-fullgraph",), source=HF_MASK, fused_layers=LLAMA_LAYERS),
    Case(
        "hf_trainer_compile.py",
        ("--backend", "aot_eager"),
        source=HF_TRAINER,
        dense_layers=LLAMA_LAYERS,
        cause="model-backend",
        fix_says=("torch_compile_backend", "inductor"),
        change=("hf_trainer_compile.py", "torch_compile_backend=args.backend"),
        gpu_args=("--backend", "aot_eager", *GPU_TRAIN),
    ),
    Case("hf_trainer_compile.py", ("--backend", "inductor"), source=HF_TRAINER, fused_layers=LLAMA_LAYERS),
    # LLaMA-Factory's default use_reentrant=True around the blocks of a compiled model: fused on an
    # H200 (torch 2.11; the profiler counts 0 dense kernels forward and backward) and on the CPU
    Case(
        "reentrant_checkpoint.py",
        ("--compile-model", "--raw"),
        source=FACTORY_CHECKPOINT,
        fused_layers=frozenset({"layers.0.self_attn", "layers.1.self_attn"}),
        gpu_args=("--compile-model", "--raw", *GPU_TRAIN),
    ),
    Case(
        "reentrant_checkpoint.py",
        ("--compile-model", "--raw", "--no-reentrant"),
        source=FACTORY_CHECKPOINT,
        fused_layers=frozenset({"layers.0.self_attn", "layers.1.self_attn"}),
        gpu_args=("--compile-model", "--raw", "--no-reentrant", *GPU_TRAIN),
    ),
    Case(
        "accelerate_dynamo.py",
        ("--backend", "aot_eager"),
        source=ACCELERATE,
        dense_layers=LLAMA_LAYERS,
        cause="model-backend",
        fix_says=("TorchDynamoPlugin", "inductor"),
        change=("accelerate_dynamo.py", "plugin = TorchDynamoPlugin(backend=args.backend"),
    ),
    Case(
        "accelerate_dynamo.py",
        ("--backend", "aot_eager", "--plain-arg"),
        source=ACCELERATE,
        dense_layers=LLAMA_LAYERS,
        cause="model-backend",
        fix_says=("dynamo_backend", "inductor"),
        change=("accelerate_dynamo.py", 'accelerator = Accelerator(cpu=args.device == "cpu", dynamo_backend'),
    ),
    Case("accelerate_dynamo.py", ("--backend", "inductor"), source=ACCELERATE, fused_layers=LLAMA_LAYERS),
    Case("ddp_compile.py", source=NANOGPT_DDP, fused_layers=DDP_LAYERS),
    Case("ddp_compile.py", ("--ddp-first",), source=NANOGPT_DDP, fused_layers=DDP_LAYERS),
    Case(
        DRAFTER,
        (*TINY_DRAFTER, "--compile-model", "aot_eager"),
        source=SPECFORGE,
        dense_layers=DRAFTER_LAYERS,
        cause="model-backend",
        fix_says=("backend='aot_eager'", "does not help"),
        change=(DRAFTER, "drafter = torch.compile(drafter, backend=args.compile_model)"),
    ),
    Case(DRAFTER, TINY_DRAFTER, source=SPECFORGE, fused_layers=DRAFTER_LAYERS),
]
