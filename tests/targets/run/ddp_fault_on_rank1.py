"""Two gloo ranks training a linear layer; rank 1 alone calls flex_attention eagerly (FLEX_LINE)."""

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import flex_attention

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    x = torch.randn(1, 2, 128, 16)
    if rank == 1:
        x = flex_attention(x, x, x)  # FLEX_LINE
    model(x).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
