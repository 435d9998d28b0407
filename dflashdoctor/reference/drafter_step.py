"""A DFlash drafter training step: the part of the pipeline where flex_attention really runs.

The drafter is a small stack of `DFlashDrafterAttention` layers over the target's context hidden
states and the draft-block embeddings, masked with the DFlash BlockMask. Which attention function
its layers call is the fault switch:

- `None` (healthy): the user wrapper, `dflashdoctor.reference.drafter.flex_attention_forward`,
  which calls `_compiled_flex_attention`;
- `"hf-flex-path"`: transformers' own flex path (`ALL_ATTENTION_FUNCTIONS["flex_attention"]`), as a
  drafter does when it sets `attn_implementation="flex_attention"` instead of using the wrapper;
- `"eager-wrapper"`: a wrapper compiled with `backend="eager"`, which never reaches Inductor and so
  runs flex_attention's dense kernel, forward and backward.

The drafter module is imported when the step is built, so that a tracer started before it sees the
compiled wrapper being made.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dflashdoctor.reference import DRAFTER_FAULTS

BLOCK_SIZE = 16


def _hf_flex(module: nn.Module) -> Callable[..., torch.Tensor]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(query, key, value, block_mask=None, enable_gqa=False, scale=None):
        out, _ = ALL_ATTENTION_FUNCTIONS["flex_attention"](module, query, key, value, block_mask, scaling=scale)
        return out.transpose(1, 2)  # transformers returns [B, L, H, D]

    return attention


def _eager_wrapper() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, backend="eager")


class DFlashDrafter(nn.Module):
    """`layers` of drafter attention; each layer's `self_attn` calls `attention`."""

    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, fault: str | None) -> None:
        super().__init__()
        drafter = importlib.import_module("dflashdoctor.reference.drafter")
        blocks = [nn.ModuleDict() for _ in range(layers)]
        wrapper = _eager_wrapper() if fault == "eager-wrapper" else None
        for layer in blocks:
            attn = drafter.DFlashDrafterAttention(hidden, heads, kv_heads, head_dim)
            if fault == "hf-flex-path":
                attn.attention = _hf_flex(attn)
            elif wrapper is not None:
                attn.attention = wrapper
            layer["self_attn"] = attn
        self.layers = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, draft: torch.Tensor, context: torch.Tensor, block_mask: Any) -> torch.Tensor:
        for layer in self.layers:
            # torch's ModuleList is not generic: its items are typed Module, these are the ModuleDicts above
            draft = draft + layer["self_attn"](self.norm(draft), context, block_mask)
        return draft


def make_drafter_step(
    config: Any,
    device: str,
    dtype: torch.dtype,
    fault: str | None,
    backward: bool,
    *,
    blocks: int = 4,
    context_len: int = 192,
) -> tuple[DFlashDrafter, Callable[[], None]]:
    """A drafter shaped like `config` (a Qwen3-style drafter config) and one training step of it.

    The step is a closure over fixed inputs, so it can be timed over repeats; each call is forward
    and, with `backward`, backward.
    """
    from dflashdoctor.reference.drafter import drafter_block_mask

    if fault is not None and fault not in DRAFTER_FAULTS:
        raise ValueError(f"unknown drafter fault {fault!r}; expected one of {', '.join(DRAFTER_FAULTS)}")
    with torch.device(device):  # initialised where it runs: the full-scale drafter took 1.7 s on the CPU
        drafter = DFlashDrafter(
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            fault,
        ).to(dtype=dtype)
    drafter.train()
    q_len = blocks * BLOCK_SIZE
    generator = torch.Generator().manual_seed(0)
    draft = torch.randn(1, q_len, config.hidden_size, generator=generator).to(device=device, dtype=dtype)
    context = torch.randn(1, context_len, config.hidden_size, generator=generator).to(device=device, dtype=dtype)
    mask = drafter_block_mask(q_len, context_len + q_len, device)

    def step() -> None:
        with torch.set_grad_enabled(backward):
            out = drafter(draft, context, mask)
            if backward:
                out.float().pow(2).mean().backward()

    return drafter, step
