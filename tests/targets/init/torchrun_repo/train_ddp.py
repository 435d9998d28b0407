"""A torchrun script: ranks train a linear layer over gloo, each calling the compiled flex_attention
wrapper. The faulty twin (tests/integration/test_init.py) makes rank 1 call flex_attention raw."""

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import flex_attention

compiled_flex = torch.compile(flex_attention)
FAULT_RANK = -1  # FAULT


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step in range(4):
        x = torch.randn(1, 2, 128, 16)
        attend = flex_attention if rank == FAULT_RANK else compiled_flex
        with torch.no_grad():
            x = attend(x, x, x)
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
