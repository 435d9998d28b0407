"""The reference DFlash drafter attention: the healthy way to call flex_attention.

`_compiled_flex_attention` is compiled once at import and reused for every call, and
`flex_attention_forward` is the entry training code calls (the default check-compile target).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from dflashdoctor.reference.masks import DEFAULT_BLOCK_SIZE, build_block_mask

_compiled_flex_attention = torch.compile(flex_attention)


def flex_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: BlockMask | None = None,
    enable_gqa: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention over [B, H, L, D] tensors through the compiled flex_attention."""
    return _compiled_flex_attention(query, key, value, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale)


class DFlashDrafterAttention(nn.Module):
    """One drafter attention layer: GQA projections around `flex_attention_forward`."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.attention = flex_attention_forward  # the reference's fault switches replace it

    def forward(self, draft: torch.Tensor, context: torch.Tensor, block_mask: BlockMask | None) -> torch.Tensor:
        """`draft` [B, Lq, hidden] attends to `context ++ draft` [B, Lkv, hidden]."""
        batch, q_len, _ = draft.shape
        kv_input = torch.cat([context, draft], dim=1)
        query = self.q_proj(draft).view(batch, q_len, self.heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(kv_input).view(batch, -1, self.kv_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(kv_input).view(batch, -1, self.kv_heads, self.head_dim).transpose(1, 2)
        out = self.attention(query, key, value, block_mask=block_mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))


def drafter_block_mask(q_len: int, kv_len: int, device: torch.device | str) -> BlockMask | None:
    """The DFlash training mask for a drafter step with `q_len` draft tokens."""
    return build_block_mask("dflash", q_len, kv_len, device, DEFAULT_BLOCK_SIZE)
