"""Two ranks (torchrun, gloo, CPU) training one layer with DDP-style gradient all-reduce; rank 1
alone calls flex_attention raw (never compiled) with a context that doubles each step, under a
6 GiB address-space limit, until its dense score matrix cannot be allocated. Rank 0 then fails in
its all-reduce when rank 1's process dies. Produces `41_produced_cpu_torchrun_rank1_flex_oom.log`:
`torchrun --nproc-per-node 2 --tee 3 ranks_flex_oom_cpu.py`, stdout and stderr."""

import resource

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import flex_attention

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
context = 1024
for step in range(12):
    query = torch.randn(1, 8, 1024, 64)
    key = torch.randn(1, 8, context if rank == 1 else 1024, 64)
    out = flex_attention(query, key, key)
    model(out).pow(2).mean().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} context={context}", flush=True)
    context *= 2
dist.destroy_process_group()
