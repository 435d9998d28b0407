"""One training step through a plain Triton kernel (an RMSNorm, no autotuning), the step that
triton_cache_damage_gpu.sh runs twice around damaging the Triton cache the first run filled."""

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=inside, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, x * rstd * w, mask=inside)


def train_step(x: torch.Tensor, weight: torch.Tensor) -> float:
    out = torch.empty_like(x)
    rms_norm_kernel[(x.shape[0],)](x, weight, out, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out.sum().item()


if __name__ == "__main__":
    print("loss", train_step(torch.randn(64, 1024, device="cuda"), torch.ones(1024, device="cuda")), flush=True)
