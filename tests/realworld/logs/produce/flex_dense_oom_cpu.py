"""A training loop whose raw (never compiled) flex_attention call gets a longer context each step,
under a 6 GiB address-space limit: flex's dense path (`sdpa_dense` -> `math_attention`) builds the
whole float32 score matrix, which doubles each step until the CPU allocator refuses it. Produces
`35_produced_cpu_flex_dense_oom.log` (stderr and stdout of `python3 flex_dense_oom_cpu.py`)."""

import resource

import torch
from torch.nn.attention.flex_attention import flex_attention

resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
context = 1024
while True:
    query = torch.randn(1, 8, 1024, 64)
    key = torch.randn(1, 8, context, 64)
    out = flex_attention(query, key, key)
    model(out).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step context={context} loss ok", flush=True)
    context *= 2
