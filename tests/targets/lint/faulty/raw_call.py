"""Fires lint-raw-flex-call: flex_attention called where nothing compiles it."""

import torch
from torch.nn.attention.flex_attention import flex_attention


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return flex_attention(q, k, v)  # RAW_CALL


@torch.compiler.disable
def debug_attention(q, k, v):
    return flex_attention(q, k, v)  # DISABLED_CALL
