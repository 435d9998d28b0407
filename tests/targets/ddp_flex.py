"""A user script that compiles a DistributedDataParallel model whose layers call flex_attention, as
data-parallel training does (one process here: gloo, world size 1, an in-memory store, so no port).

DDP's forward context (`DistributedDataParallel._inside_ddp_forward`) is on dynamo's list of
functions it must not trace, so the compiled model breaks its graph there on purpose; flex_attention
inside the pieces is still compiled by Inductor and runs fused. The report should say so: the breaks
a note, no dense call, a pass.
"""

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.nn.parallel import DistributedDataParallel


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 3 * 64)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x, block_mask):
        q, k, v = self.qkv(x).view(1, -1, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return self.out(flex_attention(q, k, v, block_mask=block_mask).transpose(1, 2).reshape(x.shape))


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Attention(), Attention()])

    def forward(self, x, block_mask):
        for layer in self.layers:
            x = x + layer(x, block_mask)
        return x


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    model = torch.compile(DistributedDataParallel(Model()))
    mask = create_block_mask(causal, None, None, 128, 128, device="cpu")
    with torch.no_grad():  # flex_attention has no backward on the CPU
        for _ in range(2):
            model(torch.randn(1, 128, 64), mask)
finally:
    dist.destroy_process_group()
