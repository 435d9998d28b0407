"""A training loop whose raw flex_attention call (dense: never compiled) gets a longer context every
step, so its float32 score matrix doubles each step until CUDA memory runs out. On a GPU only."""

import torch
from torch.nn.attention.flex_attention import flex_attention

model = torch.nn.Linear(128, 128, device="cuda", dtype=torch.bfloat16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
context = 4096
while True:
    query = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16)
    key = torch.randn(1, 8, context, 128, device="cuda", dtype=torch.bfloat16)
    out = flex_attention(query, key, key, enable_gqa=True)
    model(out).float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    context *= 2
