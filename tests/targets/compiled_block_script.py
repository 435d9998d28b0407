"""A user script that compiles a whole module which calls flex_attention inside it.

Run plainly it has no graph breaks; traced, it must still have none (the recording stand-in only
forwards inside a compiled region). With --eager-backend the module is compiled with
backend="eager", which never reaches Inductor: the call inside runs flex_attention's dense kernel.
"""

import sys

import torch
from torch.nn.attention.flex_attention import flex_attention


class Block(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return flex_attention(x, x, x)


block = torch.compile(Block(), backend="eager" if "--eager-backend" in sys.argv else "inductor")
with torch.no_grad():  # flex_attention has no CPU backward
    for _ in range(2):
        block(torch.randn(1, 2, 64, 16))
