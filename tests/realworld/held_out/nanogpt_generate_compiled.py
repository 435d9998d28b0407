"""Held-out case: nanoGPT's sampling script, `model = torch.compile(model)` followed by
`model.generate(...)`, with the GPT's attention done by flex_attention.

Source: karpathy/nanoGPT@0031515856466fcdab1486103d8863a1cc04cd8c sample.py (`if compile: model =
torch.compile(model)`, then under torch.no_grad `y = model.generate(x, max_new_tokens, ...)`) and
model.py (`GPT.generate`: crop the context to block_size, `logits, _ = self(idx_cond)`, sample, append);
the causal self-attention is swapped for flex_attention with a causal BlockMask built in the forward, as
KellerJordan/modded-nanogpt does. Re-written in our own words, tiny, on the CPU (sampling: no backward).
The prompt is one full block, so every step sees the same 128-token window.

torch.compile(model) returns an OptimizedModule that compiles only its own __call__; `.generate` is
looked up on the wrapped GPT, and inside it `self(idx_cond)` calls the uncompiled module, so every
layer's flex_attention runs dense at every sampled token. `--inplace` (nn.Module.compile(), which makes
the module's own __call__ compiled) is the healthy twin.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--inplace", action="store_true")
parser.add_argument("--max_new_tokens", type=int, default=3)
args = parser.parse_args()

BLOCK, VOCAB, N_LAYER, N_HEAD, N_EMBD = 128, 96, 2, 4, 64


def causal(b, h, q, kv):
    return q >= kv


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x, block_mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        q, k, v = (z.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for z in (q, k, v))
        y = flex_attention(q, k, v, block_mask=block_mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(N_EMBD), nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x, block_mask):
        x = x + self.attn(self.ln_1(x), block_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, N_EMBD), nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        block_mask = create_block_mask(causal, None, None, t, t, device=idx.device)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x, block_mask)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= BLOCK else idx[:, -BLOCK:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


if __name__ == "__main__":
    torch.manual_seed(1337)
    model = GPT()
    model.eval()
    if args.inplace:
        model.compile()
    else:
        model = torch.compile(model)
    x = torch.randint(0, VOCAB, (1, BLOCK))
    with torch.no_grad():
        y = model.generate(x, args.max_new_tokens, temperature=0.8, top_k=20)
        print(y[0, -args.max_new_tokens :].tolist())
