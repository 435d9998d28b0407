"""Real-code case: tanh soft-capping of attention scores (Gemma 2 / Grok-1 style) as a flex_attention
score_mod built by a closure over the cap, after meta-pytorch/attention-gym@7fdb85d0b96668397adee48de54b6f1036497717
attn_gym/mods/softcapping.py (`generate_tanh_softcap(soft_cap)` returns `tanh_softcap(score, ...)`
computing `soft_cap * tanh(score / soft_cap)`), used here as a training script would when it anneals
the cap: a Python float on the attention module, lowered a little every step, and a fresh score_mod
built from it in the compiled model's forward. Re-written in our own words (no `approx` tanh, whose
lowering is CUDA inline asm), tiny sizes.

Each step's new cap fails dynamo's guard on the float. `--static` compiles with dynamic=False: every
cap is a new graph until the recompile limit (lowered to 3 here; training code has 8), after which
the model runs eagerly and flex runs its dense kernel. The default (automatic dynamic) recompiles
once with the cap as a symbolic float: see ground_truth for what torch then does. `--tensor` is the
healthy twin: the cap lives in a 0-d tensor buffer updated in place (`fill_`), so no guard fails.
On the CPU flex has no backward, so the CPU run is a forward (no grad); `--train` runs forward and
backward (`--device cuda --train` on a GPU).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--static", action="store_true", help="torch.compile(model, dynamic=False)")
parser.add_argument("--tensor", action="store_true", help="the cap in a 0-d tensor, updated in place")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--seq", type=int, default=128, help="sequence length (2048 and up on a GPU)")
args = parser.parse_args()

torch._dynamo.config.recompile_limit = 3
DIM, HEADS, HEAD_DIM, SEQ, VOCAB = 64, 4, 16, args.seq, 256


def generate_tanh_softcap(soft_cap):
    """A tanh soft-capping score_mod for the given cap."""

    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return soft_cap * torch.tanh(score / soft_cap)

    return tanh_softcap


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.proj = nn.Linear(DIM, DIM, bias=False)
        self.soft_cap = 50.0
        self.register_buffer("soft_cap_tensor", torch.tensor(50.0), persistent=False)

    def forward(self, x, block_mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        cap = self.soft_cap_tensor if args.tensor else self.soft_cap
        out = flex_attention(q.sin(), k.sin(), v, score_mod=generate_tanh_softcap(cap), block_mask=block_mask)
        return self.proj(out.transpose(1, 2).reshape(b, s, DIM))


class Model(nn.Module):
    def __init__(self, n_layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Attention() for _ in range(n_layers)])
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, block_mask):
        h = self.embed(tokens)
        for layer in self.layers:
            h = h + layer(h, block_mask)
        return self.head(h)


def set_soft_cap(model: Model, cap: float) -> None:
    for layer in model.layers:
        layer.soft_cap = cap
        layer.soft_cap_tensor.fill_(cap)


model = Model().to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
compiled = torch.compile(model, dynamic=False) if args.static else torch.compile(model)
mask = create_block_mask(causal, None, None, SEQ, SEQ, device=args.device)
with torch.set_grad_enabled(args.train):
    for step in range(args.steps):
        set_soft_cap(model, 50.0 - 5.0 * step)  # anneal the cap
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), device=args.device)
        logits = compiled(tokens[:, :-1], mask)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        if args.train:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
