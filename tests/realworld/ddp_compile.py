"""Real-code case: DistributedDataParallel and torch.compile over a GPT whose attention is
flex_attention, in one process (gloo, world_size=1, a free local port), as nanoGPT's train.py sets
it up: karpathy/nanoGPT@e2221318e607eb5ee0669d6b7641af25a2111545 train.py (`model = torch.compile(model)`
then `model = DDP(model, device_ids=[ddp_local_rank])`; `require_backward_grad_sync` toggled per
micro-step), with the block's attention swapped for a causal flex_attention as nanoGPT forks do.
Written in our own words, tiny sizes.

Expected healthy: flex is part of the compiled graph (Inductor), no dense kernel. DDP changes how
dynamo compiles: with `torch._dynamo.config.optimize_ddp` (default "ddp_optimizer") dynamo splits the
graph at DDP's gradient-bucket boundaries. `--bucket-mb 1` asks for 1 MB buckets (the smallest cap
DDPOptimizer accepts: DDP's first bucket is 1 MB) over about 2.4 MB of parameters; default 25: one
bucket. `--ddp-first` wraps DDP first and compiles the DDP module (`torch.compile(DDP(model))`).
On the CPU flex has no backward, so the CPU run is a forward (no grad); `--train` runs forward and
backward (`--device cuda --train` on a GPU, NCCL).
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--bucket-mb", type=float, default=25.0)
parser.add_argument("--ddp-first", action="store_true", help="torch.compile(DDP(model))")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

N_EMBD, N_HEAD, HEAD_DIM, BLOCK_SIZE, VOCAB, N_LAYER = 64, 4, 16, 128, 4096, 2


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x, block_mask):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, HEAD_DIM).transpose(1, 2) for z in (q, k, v))
        y = flex_attention(F.rms_norm(q, (HEAD_DIM,)), F.rms_norm(k, (HEAD_DIM,)), v, block_mask=block_mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x, block_mask):
        x = x + self.attn(self.ln_1(x), block_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, N_EMBD)
        self.wpe = nn.Embedding(BLOCK_SIZE, N_EMBD)
        self.h = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx, targets, block_mask):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x, block_mask)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(free_port()))
dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
try:
    model = GPT().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    device_ids = [0] if args.device == "cuda" else None
    if args.ddp_first:
        model = torch.compile(DDP(model, device_ids=device_ids, bucket_cap_mb=args.bucket_mb))
    else:
        model = torch.compile(model)
        model = DDP(model, device_ids=device_ids, bucket_cap_mb=args.bucket_mb)
    mask = create_block_mask(causal, None, None, BLOCK_SIZE, BLOCK_SIZE, device=args.device)
    with torch.set_grad_enabled(args.train):
        for _ in range(args.steps):
            data = torch.randint(0, VOCAB, (2, BLOCK_SIZE + 1), device=args.device)
            logits, loss = model(data[:, :-1], data[:, 1:], mask)
            if args.train:
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
finally:
    dist.destroy_process_group()
