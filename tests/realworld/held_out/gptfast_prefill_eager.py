"""Held-out case: gpt-fast's flex-decoding branch, generation with only the decode step compiled.

Source: pytorch-labs/gpt-fast@d983e3dd6140268df04980f1574b433cad85b78b (branch bf/flex-decoding-integrate),
generate.py (`prefill`, `decode_one_token`, the `if compile:` block that wraps `decode_one_token` in
torch.compile(mode="reduce-overhead", fullgraph=True) and wraps `prefill` only `if compile_prefill:`)
and model.py (`Attention.forward` calls flex_attention with a BlockMask over the whole KV cache;
`Transformer.forward` rebinds `mask.mask_mod` with the position offset). Re-written in our own words,
tiny and on the CPU (the prompt is one full 128-token block: torch 2.13's CPU Inductor cannot build a
compiled create_block_mask whose query length is a partial block or symbolic), the decode step
slices the full-cache BlockMask to the current query block each token, as the branch does.
Generation is inference: no backward.

Default (as the branch's default `compile_prefill=False`): the prompt's prefill runs the model
uncompiled, so every layer's flex_attention runs its dense kernel once; the compiled decode steps
are fused. `--compile_prefill` is the healthy twin.
"""

import argparse

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--compile_prefill", action="store_true")
parser.add_argument("--new_tokens", type=int, default=4)
args = parser.parse_args()

DIM, HEADS, HEAD_DIM, LAYERS, VOCAB, MAX_SEQ, PROMPT = 64, 4, 16, 2, 128, 256, 128


def causal(b, h, q, kv):
    return q >= kv


def shifted(mask_mod, offset):
    def inner(b, h, q, kv):
        return mask_mod(b, h, q + offset, kv)

    return inner


def rotary(x, pos):
    # rotate-half form; it keeps q a plain 4-D buffer, which Inductor's CPU flex-decoding template needs
    freqs = pos[:, None].float() / (10000 ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM))
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, HEADS, MAX_SEQ, HEAD_DIM))
        self.register_buffer("v", torch.zeros(1, HEADS, MAX_SEQ, HEAD_DIM))

    def update(self, pos, k, v):
        self.k[:, :, pos] = k
        self.v[:, :, pos] = v
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, DIM, bias=False)
        self.cache = Cache()

    def forward(self, x, pos, mask):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, HEADS, HEAD_DIM).transpose(1, 2) for z in self.qkv(x).split(DIM, -1))
        q, k = rotary(q, pos), rotary(k, pos)
        k, v = self.cache.update(pos, k, v)
        y = flex_attention(q, k, v, block_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, DIM))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, pos, mask):
        x = x + self.attention(self.norm(x), pos, mask)
        return x + self.mlp(x)


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, mask, idx, pos):
        mask.mask_mod = shifted(mask.mask_mod, pos[0])
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, pos, mask)
        return self.head(x)


def prefill(model, idx, pos):
    mask = create_block_mask(causal, 1, 1, pos.shape[0], MAX_SEQ, device="cpu")
    return model(mask, idx, pos)[:, -1].argmax(-1, keepdim=True)


def decode_one_token(model, idx, pos, full_mask: BlockMask):
    block = pos // full_mask.BLOCK_SIZE[0]
    mask = full_mask[:, :, block]
    mask.mask_mod = full_mask.mask_mod
    mask.seq_lengths = (1, MAX_SEQ)
    return model(mask, idx, pos)[:, -1].argmax(-1, keepdim=True)


decode_one_token = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
if args.compile_prefill:
    # the branch passes dynamic=True; torch 2.13's CPU Inductor cannot build the compiled
    # create_block_mask for a symbolic query length, so the twin keeps the default (static first)
    prefill = torch.compile(prefill, fullgraph=True)


@torch.no_grad()
def generate(model, prompt, new_tokens):
    token = prefill(model, prompt, torch.arange(prompt.shape[1]))
    full_mask = create_block_mask(causal, 1, 1, MAX_SEQ, MAX_SEQ, device="cpu")
    pos = torch.tensor([prompt.shape[1]])
    out = [token]
    for _ in range(new_tokens - 1):
        token = decode_one_token(model, token, pos, full_mask)
        pos += 1
        out.append(token.clone())
    return torch.cat(out, dim=1)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Transformer().eval()
    prompt = torch.randint(0, VOCAB, (1, PROMPT))
    print(generate(model, prompt, args.new_tokens).tolist())
