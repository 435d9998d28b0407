"""The target side of the reference DFlash setup: data-parallel pairs, each with its own frozen target.

In the original run each data-parallel pair (one GPU each) ran its target's forward from a thread
pool. The target's gated DeltaNet layers call FLA's autotuned Triton kernels, which are module
globals shared by every thread and device, so the first cold forward of two pairs at once crashed
the autotuner. The fault switch is how the pairs' target forwards run:

- `concurrent` (the fault): at once, one thread per pair;
- `sequential` (the fix): one after another.

`target_forward(worker, device)` is one pair's forward in the race TARGET convention, so
`dflashdoctor race --kernel reference` runs the pairs under the race's trials: `--fix none` is the
concurrent fault, `--fix sequential` the fix (and `--fix lock` the in-process alternative).
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

import torch

from dflashdoctor.fla_guards import fla_kept_out, fla_unusable_on

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TARGET_FORWARDS = ("concurrent", "sequential")
TARGET_SPEC = "dflashdoctor.reference.target_pairs:target_forward"
TOKENS = 2048  # the sequence length of the measured crash

# The 27B target's structure (three gated DeltaNet layers, then full attention) at a width one GPU
# builds in a moment; linear-attention head dims stay at the real 128, the shape FLA's kernels tune for.
_OVERRIDES = {
    "num_hidden_layers": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
}

_BUILD = threading.Lock()  # model building seeds the global RNG: one pair at a time
_TARGETS: dict[tuple[int, str], PreTrainedModel] = {}


def fla_importable() -> bool:
    """FLA must import before transformers' modeling module does, or the layers bind the torch fallback."""
    try:
        importlib.import_module("fla.ops.gated_delta_rule")
    except Exception:  # not installed, or it cannot load here (no GPU build of triton)
        return False
    return True


def build_target(device: str, dtype: torch.dtype, seed: int = 0) -> PreTrainedModel:
    """A random-weight Qwen3.5-style target (gated DeltaNet + full attention), frozen for inference.

    Its gated DeltaNet layers run FLA's kernels where they can (on a GPU); elsewhere FLA is kept from
    importing, so they run transformers' torch fallback instead of failing at the first call."""
    cannot_run = fla_unusable_on(torch.device(device).type)
    if not cannot_run:
        fla_importable()
    from transformers import AutoModelForCausalLM

    from dflashdoctor.models import build_config

    config = build_config("qwen27b", "tiny")
    for key, value in _OVERRIDES.items():
        setattr(config, key, value)
    with torch.random.fork_rng(devices=[]), fla_kept_out(when=cannot_run):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


def linear_attention_impl(model: torch.nn.Module) -> str | None:
    """What the target's gated DeltaNet layers run: an FLA kernel or transformers' torch fallback."""
    from dflashdoctor.hooks.hf_attention import is_linear_attention_module, kernel_impl

    for module in model.modules():
        if is_linear_attention_module(module):
            return kernel_impl(module)
    return None


def target_for(worker: int, device: str) -> PreTrainedModel:
    with _BUILD:
        key = (worker, device)
        if key not in _TARGETS:
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
            _TARGETS[key] = build_target(device, dtype, seed=worker)
        return _TARGETS[key]


def target_forward(worker: int, device: str) -> torch.Tensor:
    """Pair `worker`'s target forward on its own copy of the target (built on first use): the last
    hidden states, which the drafter would read as its context."""
    model = target_for(worker, device)
    generator = torch.Generator().manual_seed(1000 + worker)
    ids = torch.randint(0, model.config.vocab_size, (1, TOKENS), generator=generator).to(device)
    with torch.no_grad():
        return model(input_ids=ids, output_hidden_states=True).hidden_states[-1]


def describe(fix: str) -> str:
    """The reference switch a race fix stands for."""
    forwards = "sequential" if fix == "sequential" else "concurrent"
    lock = ", each autotuner behind a per-instance lock" if fix == "lock" else ""
    return f"reference target forwards: {forwards}{lock}"


def model_info(device: str) -> dict[str, Any]:
    """What the pairs run, for the report: layer kinds and the linear-attention implementation."""
    model = target_for(0, device)
    return {
        "layer_types": list(model.config.layer_types),
        "linear_attention": linear_attention_impl(model),
        "tokens": TOKENS,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
