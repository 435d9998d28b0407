"""Model presets for trace-attention: HF config classes filled in, at full or tiny scale.

Probed side: standard library here, transformers imported only when a config is built. `full` is
the real architecture (the Qwen3.5/3.6-27B target's config, and its DFlash drafter's); `tiny`
keeps the structure (layer pattern, head ratios, GQA, head dims where affordable) and shrinks
widths and depth so that a CPU forward takes seconds. Weights are always random: nothing is
downloaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.placed_files import MIB, PlacedFileError, read_placed
from dflashdoctor.probe_support import UsageError, first_line

SCALES = ("tiny", "full")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model_type: str
    full: dict[str, Any]
    tiny: dict[str, Any] = field(default_factory=dict)  # overrides of `full`
    # a speculative-decoding target: frozen in drafter training, so traced forward only, under no_grad,
    # unless --backward asks for more
    frozen_target: bool = False


def is_frozen_target(spec: str | None) -> bool:
    preset = PRESETS.get(spec or "")
    return preset is not None and preset.frozen_target


_QWEN27B_FULL = {
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "intermediate_size": 17408,
    "vocab_size": 248320,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)],
}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "qwen27b",
            "Qwen3.5/3.6-27B text target: gated DeltaNet linear attention, full attention every 4th layer",
            "qwen3_5_text",
            _QWEN27B_FULL,
            {
                "hidden_size": 192,
                "num_hidden_layers": 8,
                "num_attention_heads": 6,
                "num_key_value_heads": 1,
                "head_dim": 64,
                "intermediate_size": 384,
                "vocab_size": 1024,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 6,
                "linear_key_head_dim": 32,
                "linear_value_head_dim": 32,
                "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(8)],
            },
            frozen_target=True,
        ),
        Preset(
            "qwen27b-dflash",
            "DFlash drafter for the 27B target: Qwen3-style, 5 layers, 32/8 heads, head dim 128",
            "qwen3",
            {
                "hidden_size": 5120,
                "num_hidden_layers": 5,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "intermediate_size": 17408,
                "vocab_size": 248320,
            },
            {"hidden_size": 256, "head_dim": 32, "intermediate_size": 512, "vocab_size": 1024},
        ),
        Preset(
            "qwen3",
            "dense Qwen3 (0.6B dimensions), supports flex_attention",
            "qwen3",
            {
                "hidden_size": 1024,
                "num_hidden_layers": 28,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "intermediate_size": 3072,
                "vocab_size": 151936,
            },
            {"hidden_size": 128, "num_hidden_layers": 4, "head_dim": 32, "intermediate_size": 256, "vocab_size": 1024},
        ),
        Preset(
            "llama",
            "Llama-style (Llama-3.2-1B dimensions), supports flex_attention",
            "llama",
            {
                "hidden_size": 2048,
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "intermediate_size": 8192,
                "vocab_size": 128256,
            },
            {"hidden_size": 128, "num_hidden_layers": 4, "head_dim": 16, "intermediate_size": 256, "vocab_size": 1024},
        ),
    )
}


def preset_names() -> str:
    return ", ".join(PRESETS)


_CONFIG_BYTES = 16 * MIB  # a model's config.json is kilobytes


def config_source(spec: str) -> tuple[str, dict[str, Any] | None]:
    """(model_type, config dict) of a preset name, a config.json, or a folder holding one.

    A preset returns None as its dict: its kwargs depend on the scale. Every way `spec` can be
    wrong is a UsageError.
    """
    if spec in PRESETS:
        return PRESETS[spec].model_type, None
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    if not (spec.endswith(".json") or os.path.isdir(spec)):
        raise UsageError(f"unknown model preset {spec!r}; known presets: {preset_names()} (or a config.json path)")
    try:  # a regular file up to a cap, opened without blocking: a FIFO or /dev/zero there is refused
        data = json.loads(read_placed(path, _CONFIG_BYTES, follow=True))
    except PlacedFileError as exc:
        raise UsageError(f"model config {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read model config {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"model config {path} is not valid JSON: line {exc.lineno}: {exc.msg}") from exc
    except (ValueError, RecursionError) as exc:  # not UTF-8, a number past 4,300 digits, nested too deep
        raise UsageError(f"model config {path} is not a config: {type(exc).__name__}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise UsageError(f"model config {path} has no model_type")
    return data["model_type"], data


@dataclass(frozen=True)
class DrafterDimensions:
    """What the reference drafter reads from a config: enough to build it without transformers."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


def drafter_dimensions(preset: str, scale: str) -> DrafterDimensions:
    """A preset's attention dimensions at `scale`, read from the preset itself (which sets all five):
    importing transformers to build its config cost seconds of a warm gate's longest probe."""
    kwargs = {**PRESETS[preset].full, **(PRESETS[preset].tiny if scale == "tiny" else {})}
    return DrafterDimensions(**{name: kwargs[name] for name in DrafterDimensions.__dataclass_fields__})


def build_config(spec: str, scale: str) -> Any:
    """A transformers config object for `spec` at `scale` (tiny applies only to presets)."""
    from transformers import AutoConfig

    model_type, data = config_source(spec)
    if data is None:
        preset = PRESETS[spec]
        kwargs = {**preset.full, **(preset.tiny if scale == "tiny" else {})}
    else:
        kwargs = {k: v for k, v in data.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(model_type, **kwargs)
    except (ValueError, KeyError, TypeError) as exc:
        # transformers lists every model type it knows in this message: keep the line readable
        reason = first_line(str(exc), type(exc).__name__)
        reason = reason if len(reason) <= 200 else reason[:200].rsplit(" ", 1)[0] + " ..."
        raise UsageError(f"transformers cannot build a {model_type!r} config: {reason}") from exc
