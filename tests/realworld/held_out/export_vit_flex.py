"""Held-out case: a ViT-style block with flex_attention, exported with torch.export and served by
calling the ExportedProgram's module.

Source: pytorch/pytorch issue #140400 (bhack's `MinimalAttention`: qkv Linear, reshape/permute,
`flex_attention(q, k, v, scale=self.scale)`, proj; exported with torch.export.export) and
pytorch/tutorials@5130967035247c8343376ee69f49d6e10d61eaca intermediate_source/torch_export_tutorial.py
(run the program with `ep.module()`, or compile it to a .so with AOTInductor). Re-written in our own
words: two pre-norm blocks, tiny, on the CPU, inference.

`ep.module()` is an fx GraphModule that runs each node eagerly: the flex_attention higher-order op in
it dispatches to its dense (vmap + softmax) kernel, one per block per call; exporting does not compile
anything. `--aoti` (torch._inductor.aoti_compile_and_package + aoti_load_package) is the healthy twin:
Inductor generates the fused flex kernel ahead of time.
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--aoti", action="store_true")
parser.add_argument("--calls", type=int, default=2)
args = parser.parse_args()

DIM, HEADS, DEPTH, TOKENS = 64, 4, 2, 256


class MinimalAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(0, 3, 2, 1, 4)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        out = flex_attention(q, k, v, scale=self.scale)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = MinimalAttention(DIM, HEADS)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(DEPTH)))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x):
        return self.norm(self.blocks(x))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = TinyViT().eval()
    x = torch.randn(2, TOKENS, DIM)
    with torch.no_grad():
        ep = torch.export.export(model, (x,))
        if args.aoti:
            path = os.path.join(tempfile.mkdtemp(), "tiny_vit.pt2")
            runner = torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(ep, package_path=path))
        else:
            runner = ep.module()
        for _ in range(args.calls):
            y = runner(torch.randn(2, TOKENS, DIM))
        print(tuple(y.shape), float(y.square().mean()))
