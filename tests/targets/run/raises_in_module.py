"""A model whose second block raises in its forward: the exception names `blocks.1`."""

import torch


class Block(torch.nn.Module):
    def __init__(self, broken: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.broken = broken

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.broken:
            raise ValueError("block input has the wrong scale")  # RAISE_LINE
        return self.linear(x)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(False), Block(True)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


Net()(torch.randn(2, 8))
