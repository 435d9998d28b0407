"""gloo ranks training a linear layer; one rank alone (FAULT_RANK, default 1) calls flex_attention
eagerly, at the line marked below."""

import os

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import flex_attention

dist.init_process_group("gloo")
rank = dist.get_rank()
fault_rank = int(os.environ.get("FAULT_RANK", "1"))
torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    x = torch.randn(1, 2, 128, 16)
    if rank == fault_rank:
        x = flex_attention(x, x, x)  # FLEX_LINE
    model(x).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
