"""Fires lint-wrapper-rebound: torchtitan's pattern, the class's compiled wrapper rebound after import."""

import torch
from torch.nn.attention.flex_attention import flex_attention


class FlexAttentionWrapper(torch.nn.Module):
    _compiled_flex_attn = torch.compile(flex_attention)

    def forward(self, q, k, v, block_mask):
        return FlexAttentionWrapper._compiled_flex_attn(q, k, v, block_mask=block_mask)


FlexAttentionWrapper._compiled_flex_attn = flex_attention  # REBOUND_LINE
