"""Fault: a score_mod reads a module-level int that changes with every batch's length.

Dynamo guards on the value of a global Python int it reads while tracing, so each new length is a
recompile; past `torch._dynamo.config.recompile_limit` (8 by default) dynamo stops compiling this
frame and runs flex_attention eagerly, which is the dense kernel, with one log line as the only
sign. The score_mod itself only masks keys beyond the valid length, so outputs stay correct.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

_compiled_flex_attention = torch.compile(flex_attention)

valid_kv_len = 0  # set per batch, as a collator-driven global would be


def _mask_padding(score, b, h, q_idx, kv_idx):
    return torch.where(kv_idx < valid_kv_len, score, -float("inf"))


def flex_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: BlockMask | None = None,
    enable_gqa: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    global valid_kv_len
    valid_kv_len = key.shape[-2]
    return _compiled_flex_attention(
        query,
        key,
        value,
        score_mod=_mask_padding,
        block_mask=block_mask,
        enable_gqa=enable_gqa,
        scale=scale,
    )
