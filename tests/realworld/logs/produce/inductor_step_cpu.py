"""One compiled step on the CPU (Inductor writes its generated Python and C++ into
TORCHINDUCTOR_CACHE_DIR), the step inductor_cache_damage_cpu.sh runs around damaging that cache."""

import torch


@torch.compile
def step(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight).relu().sum()


print("loss", step(torch.randn(64, 128), torch.ones(128)).item(), flush=True)
