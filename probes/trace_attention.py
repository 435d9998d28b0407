"""Probe: where does a model's attention run, through which implementation, fused or dense?

Builds the model from its config with random weights, asking transformers for flex_attention;
a model class that refuses it is recorded and rebuilt with its default implementation. Then runs
`steps` training-mode forwards (and backwards where the device allows) with the dense-path hook
and the attention recorder installed, and reports each attention layer and each call site.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.hf_attention import HFAttentionRecorder, kernel_impl
from dflashdoctor.models import build_config
from dflashdoctor.probe_support import UsageError, probe_main

_WANTED = "flex_attention"


def _device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but torch sees no CUDA device here")
    return requested


def _build(make_config: Callable[[], Any], device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, str | None]:
    """The model with flex_attention if its class takes it; else its default, and the refusal.

    A refused attn_implementation stays on the config object, so the fallback gets a fresh config.
    """
    from transformers import AutoModelForCausalLM

    with torch.device(device):  # initialise on the device: a full-size model is slow to build on the CPU
        try:
            model = AutoModelForCausalLM.from_config(make_config(), attn_implementation=_WANTED, dtype=dtype)
            refusal = None
        except ValueError as exc:
            refusal = str(exc).split(". ")[0]
            model = AutoModelForCausalLM.from_config(make_config(), dtype=dtype)
    return model, refusal


def _layers(model: torch.nn.Module, config: Any, recorder: HFAttentionRecorder) -> list[dict[str, Any]]:
    """One row per attention layer: kind from the config's layer types, impl from what ran."""
    layer_types = getattr(config, "layer_types", None) or []
    seen = {site.module: site.impl for site in recorder.sites.values()}
    rows = []
    for name, module in model.named_modules():
        if name not in seen:
            continue
        index = getattr(module, "layer_idx", None)
        kind = layer_types[index] if isinstance(index, int) and index < len(layer_types) else "full_attention"
        impl = seen[name]
        if impl == "module-forward":
            impl = kernel_impl(module) or type(module).__name__
        rows.append({"module": name, "class": type(module).__name__, "kind": kind, "impl": impl})
    return rows


def run(settings: dict[str, Any]) -> dict[str, Any]:
    device = _device(settings["device"])
    scale = settings["scale"] if settings["scale"] != "auto" else ("full" if device == "cuda" else "tiny")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, refusal = _build(lambda: build_config(settings["model"], scale), device, dtype)
    config = model.config
    impl = config._attn_implementation
    # flex_attention has no CPU backward, and refuses even a forward whose inputs require grad.
    backward = settings["backward"] and not (device == "cpu" and impl == _WANTED)
    model.train()
    seq_len = settings["seq_len"]
    generator = torch.Generator().manual_seed(0)
    dense = DenseFlexRecorder()
    with dense, HFAttentionRecorder(model, dense) as recorder:
        for step in range(settings["steps"]):
            dense.phase = f"step{step}"
            ids = torch.randint(0, config.vocab_size, (1, seq_len), generator=generator).to(device)
            with torch.set_grad_enabled(backward):
                out = model(input_ids=ids, labels=ids)
                if backward:
                    out.loss.backward()
    return {
        "device": device,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "transformers": __import__("transformers").__version__,
        "model": settings["model"],
        "scale": scale,
        "model_class": type(model).__name__,
        "model_type": config.model_type,
        "attn_implementation": impl,
        "flex_refused": refusal,
        "backward": backward,
        "seq_len": seq_len,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": _layers(model, config, recorder),
        "sites": [site.to_dict() for site in recorder.sites.values()],
        "dense_events": [e.to_dict() for e in dense.events],
        "hook_unavailable": dense.unavailable or recorder.unavailable,
    }


if __name__ == "__main__":
    probe_main(run)
