"""`--kernel fla`: FLA's gated delta rule forward, the call that crashed in the original DFlash run.

`chunk_gated_delta_rule` (fla-core 0.6.0 signature, `[B, T, H, K]` layout) runs six autotuned
kernels, all module globals shared by every thread. The shape is that of the measured crash:
B=1, T=2048, H=16, K=V=128, bf16. The call convention is the one every race TARGET follows:
`fn(worker, device) -> tensor`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH, TOKENS, HEADS, HEAD_DIM = 1, 2048, 16, 128


def gated_delta_rule_forward(worker: int, device: str) -> torch.Tensor:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    generator = torch.Generator(device=device).manual_seed(worker)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=generator)

    q = randn(BATCH, TOKENS, HEADS, HEAD_DIM).to(torch.bfloat16)
    k = F.normalize(randn(BATCH, TOKENS, HEADS, HEAD_DIM), dim=-1).to(torch.bfloat16)
    v = randn(BATCH, TOKENS, HEADS, HEAD_DIM).to(torch.bfloat16)
    g = F.logsigmoid(randn(BATCH, TOKENS, HEADS))
    beta = randn(BATCH, TOKENS, HEADS).sigmoid().to(torch.bfloat16)
    out, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    return out
