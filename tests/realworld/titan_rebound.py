"""Real-code case: the wrapper pattern of pytorch/torchtitan@0012170a0708b751408e6085f970082ecd678d2b
(torchtitan/models/attention.py, `FlexAttentionWrapper`): a module that keeps its compiled
flex_attention as a class attribute and calls it by the class's name. Written here in our own words,
tiny sizes. `--rebind` is the faulty case: the class attribute is later rebound to the raw
flex_attention (as a debugging switch or a test harness does), so every call runs dense while the
call line still reads "compiled"; without it, the healthy twin. `--device cuda` runs it on a GPU.
"""

import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class FlexAttentionWrapper(torch.nn.Module):
    _compiled_flex_attn = torch.compile(flex_attention)

    def forward(self, q, k, v, *, block_mask):
        return FlexAttentionWrapper._compiled_flex_attn(q, k, v, block_mask=block_mask)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 3 * 64)
        self.attention = FlexAttentionWrapper()

    def forward(self, x, block_mask):
        q, k, v = self.qkv(x).view(1, -1, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return self.attention(q, k, v, block_mask=block_mask)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x, block_mask):
        for layer in self.layers:
            x = x + layer(x, block_mask).transpose(1, 2).reshape(x.shape)
        return x


if "--rebind" in sys.argv:
    FlexAttentionWrapper._compiled_flex_attn = flex_attention

device = "cuda" if "cuda" in sys.argv else "cpu"
mask = create_block_mask(causal, None, None, 128, 128, device=device)
with torch.no_grad():
    Model().to(device)(torch.randn(1, 128, 64, device=device), mask)
