"""The drafter's trainer. flex_attention has no backward on the CPU: the attention runs without
grad, a head over it is trained, one optimizer step a batch."""

import torch
from drafter.attention import DrafterAttention


def main() -> None:
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(DrafterAttention(64, 4) for _ in range(2))
    head = torch.nn.Linear(64, 1)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    for _step in range(4):
        x = torch.randn(1, 128, 64)
        with torch.no_grad():
            for layer in layers:
                x = layer(x)
        head(x).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
