"""A trainer whose attention goes through a wrapper compiled once with Inductor, as a team's does.
Run by the gate on each node of a cluster: what differs is the node's environment, never this file.
TRAIN_STEP_SLEEP (seconds) stands for a slow node (other jobs on its GPUs, throttled clocks); a node
with TORCHDYNAMO_DISABLE=1 set runs the wrapper eagerly, so its flex_attention runs dense."""

import os
import time

import torch
from torch.nn.attention.flex_attention import flex_attention

compiled_flex = torch.compile(flex_attention)
pause = float(os.environ.get("TRAIN_STEP_SLEEP", "0"))
torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(100):  # the gate stops it after run_steps optimizer steps
    x = torch.randn(1, 2, 128, 16)
    x = compiled_flex(x, x, x)  # FLEX_LINE
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(pause)
