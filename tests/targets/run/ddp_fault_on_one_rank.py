"""Ranks training a linear layer; one rank alone (FAULT_RANK, default 1) calls flex_attention
eagerly, at the line marked below. gloo on the CPU; DDP_BACKEND=nccl puts each rank on its
LOCAL_RANK's GPU."""

import os

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import flex_attention

backend = os.environ.get("DDP_BACKEND", "gloo")
dist.init_process_group(backend)
rank = dist.get_rank()
device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if backend == "nccl" else "cpu"
fault_rank = int(os.environ.get("FAULT_RANK", "1"))
torch.manual_seed(0)
model = torch.nn.Linear(16, 16).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    x = torch.randn(1, 2, 128, 16, device=device)
    if rank == fault_rank:
        x = flex_attention(x, x, x)  # FLEX_LINE
    model(x).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
