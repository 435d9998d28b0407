"""Held-out case: `@torch.compile` written as a decorator on an attention module's `forward` method, a
sliding-window mask_mod bound with functools.partial, a compiled create_block_mask, and inference under
torch.inference_mode.

Source: meta-pytorch/attention-gym@a72972153a98ddb02aa2b57d7b3799fb42170b74 (attn_gym/masks/sliding_window.py:
`generate_sliding_window(window_size)` closes over the window and is and-ed with a causal mask; here the
window is bound with functools.partial instead, as Mistral-style ports do), the torch.compile docs'
decorator form (`@torch.compile` on a function or method), and a serving loop under
torch.inference_mode. Re-written in our own words, tiny, on the CPU.

Healthy: the decorated forward is compiled per call site (one graph reused by both layers, `self` is
an input); the partial's bound window is a constant for dynamo, so flex is fused in every call.
`--no-decorator` is the faulty twin (the same module, forward not compiled: flex dense in each layer).
"""

import argparse
import functools

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--no-decorator", action="store_true")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

DIM, HEADS, LAYERS, VOCAB, SEQ, WINDOW = 64, 4, 2, 128, 256, 64


def sliding_window_causal(b, h, q_idx, kv_idx, window_size):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= window_size)


compile_forward = (lambda fn: fn) if args.no_decorator else torch.compile


class SlidingWindowAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)

    @compile_forward
    def forward(self, x, block_mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        y = flex_attention(q, k, v, block_mask=block_mask)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, DIM))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.attn = nn.ModuleList(SlidingWindowAttention() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens, block_mask):
        x = self.embed(tokens)
        for layer in self.attn:
            x = layer(x, block_mask)
        return self.head(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Model().eval()
    mask_mod = functools.partial(sliding_window_causal, window_size=WINDOW)
    block_mask = torch.compile(create_block_mask)(mask_mod, None, None, SEQ, SEQ, device="cpu")
    with torch.inference_mode():
        for _ in range(args.steps):
            tokens = torch.randint(0, VOCAB, (2, SEQ))
            print(model(tokens, block_mask).argmax(-1)[0, :4].tolist())
