"""A SpecForge-like drafter's attention: one flex_attention wrapper, compiled once at import.
BACKEND is rewritten by the faulty twin (tests/integration/test_init.py) to "eager"."""

import torch
from torch.nn.attention.flex_attention import flex_attention

compiled_flex = torch.compile(flex_attention)  # BACKEND


class DrafterAttention(torch.nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return compiled_flex(q, k, v).transpose(1, 2).reshape(b, s, -1)
