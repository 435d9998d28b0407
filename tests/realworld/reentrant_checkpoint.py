"""Real-code case: activation checkpointing of every decoder block with
`torch.utils.checkpoint.checkpoint(..., use_reentrant=True)`, around blocks whose attention is
flex_attention.

Sources, re-written here in our own words, tiny sizes:
- hiyouga/LLaMA-Factory@06d78ff17112981ecf93ca79debb5b041883eeaa src/llamafactory/model/model_utils/checkpointing.py
  (`_gradient_checkpointing_enable`: `gradient_checkpointing_kwargs = {"use_reentrant": True}` unless told
  otherwise, then `partial(checkpoint, **gradient_checkpointing_kwargs)` as the model's
  `_gradient_checkpointing_func`, which each decoder layer's call goes through);
- pytorch/torchtitan@177b050ca1c54a6264eb7912e5b4778afeabe01d torchtitan/models/attention.py (the block's
  attention calls a compiled flex_attention kept on a class: `FlexAttention.flex_attn`).

Default: the model runs eagerly, each block is checkpointed with use_reentrant=True and calls the
compiled flex wrapper. `--no-reentrant` is the twin (use_reentrant=False). `--compile-model --raw`
compiles the whole model instead and lets the block call the raw flex_attention (flex traced into the
model's graph), with use_reentrant=True: the reentrant checkpoint re-runs each block's forward during
backward, outside any compiled region; `--compile-model --raw --no-reentrant` is its twin (dynamo
traces the non-reentrant checkpoint as a higher-order op, the recompute stays in the compiled
backward). On the CPU flex has no backward, so the CPU run is a forward (no grad) only and the
checkpoint's recompute never happens there; `--train` runs forward and backward (`--device cuda --train`
on a GPU, where the difference shows).
"""

import argparse
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("--no-reentrant", action="store_true", help="checkpoint with use_reentrant=False")
parser.add_argument("--compile-model", action="store_true", help="torch.compile the whole model")
parser.add_argument("--raw", action="store_true", help="the block calls the raw flex_attention")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--seq", type=int, default=128, help="sequence length (2048 and up on a GPU)")
args = parser.parse_args()

DIM, HEADS, HEAD_DIM, SEQ, VOCAB = 64, 4, 16, args.seq, 256


class FlexAttention(nn.Module):
    flex_attn = torch.compile(flex_attention)

    def forward(self, q, k, v, block_mask):
        if args.raw:
            return flex_attention(q, k, v, block_mask=block_mask)
        return FlexAttention.flex_attn(q, k, v, block_mask=block_mask)


def rotary(x):
    """Rotary position embedding on (bs, heads, seq, head_dim), rotating halves."""
    seq = x.shape[2]
    freqs = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device=x.device) / HEAD_DIM))
    angles = torch.outer(torch.arange(seq, device=x.device), freqs)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], dim=-1)


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.self_attn = FlexAttention()
        self.o_proj = nn.Linear(DIM, DIM, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, block_mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.input_layernorm(x)).view(b, s, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        out = self.self_attn(rotary(q), rotary(k), v, block_mask)
        h = x + self.o_proj(out.transpose(1, 2).reshape(b, s, DIM))
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, n_layers: int = 2) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([DecoderLayer() for _ in range(n_layers)])
        self.norm = nn.RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self._gradient_checkpointing_func = None

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        if gradient_checkpointing_kwargs is None:
            gradient_checkpointing_kwargs = {"use_reentrant": True}
        self._gradient_checkpointing_func = partial(checkpoint, **gradient_checkpointing_kwargs)

    def forward(self, tokens, block_mask):
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            if self._gradient_checkpointing_func is not None:
                h = self._gradient_checkpointing_func(layer.__call__, h, block_mask)
            else:
                h = layer(h, block_mask)
        return self.lm_head(self.norm(h))


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


model = Model().to(args.device)
if args.no_reentrant:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
else:
    model.gradient_checkpointing_enable()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
forward = torch.compile(model) if args.compile_model else model
mask = create_block_mask(causal, None, None, SEQ, SEQ, device=args.device)
with torch.set_grad_enabled(args.train):
    for _ in range(args.steps):
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), device=args.device)
        logits = forward(tokens[:, :-1], mask)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        if args.train:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
