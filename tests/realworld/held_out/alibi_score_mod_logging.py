"""Held-out case: a compiled ALiBi model whose score_mod still carries a debug logging call.

Source: meta-pytorch/attention-gym@a72972153a98ddb02aa2b57d7b3799fb42170b74 attn_gym/mods/alibi.py
(`generate_alibi_bias(H)` returns `alibi_mod(score, b, h, q_idx, kv_idx)`: `score + (kv_idx - q_idx) *
exp2(-(h + 1) * 8 / H)`), used with a causal BlockMask in a model compiled with torch.compile; the
debug line follows the score_mod debugging that flex's own warning and pytorch/pytorch PR #158534
describe (print / breakpoints inside score_mod), here a `logger.debug(...)` left in after debugging.
Re-written in our own words, tiny; on the CPU it is an evaluation pass (flex has no CPU backward);
`--device cuda --train` runs forward and backward.

Dynamo cannot trace the logging call inside the score_mod subgraph, so it cannot build the
flex_attention higher-order op: the call graph-breaks and runs eagerly, i.e. flex's dense kernel, in
every layer and every step, although the rest of the model is compiled. Nothing is printed (DEBUG is
below the default level). `--no-log` is the healthy twin.
"""

import argparse
import logging

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--no-log", action="store_true")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward: GPU only)")
args = parser.parse_args()

logger = logging.getLogger("alibi")
DIM, HEADS, LAYERS, VOCAB, SEQ = 64, 4, 2, 128, 256


def generate_alibi_bias(H):
    def alibi_mod(score, b, h, q_idx, kv_idx):
        if not args.no_log:
            logger.debug("alibi score_mod: score dtype %s", score.dtype)
        scale = torch.exp2(-((h + 1) * 8.0 / H))
        return score + (kv_idx - q_idx) * scale

    return alibi_mod


def causal(b, h, q, kv):
    return q >= kv


class AlibiAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.score_mod = generate_alibi_bias(HEADS)

    def forward(self, x, block_mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        y = flex_attention(q, k, v, score_mod=self.score_mod, block_mask=block_mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, DIM))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = AlibiAttention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x, block_mask):
        x = x + self.attn(self.ln1(x), block_mask)
        return x + self.mlp(self.ln2(x))


class AlibiLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens, block_mask):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, block_mask)
        return self.head(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.compile(AlibiLM().to(args.device).train(args.train))
    block_mask = create_block_mask(causal, None, None, SEQ, SEQ, device=args.device)
    with torch.set_grad_enabled(args.train):
        for _ in range(args.steps):
            tokens = torch.randint(0, VOCAB, (2, SEQ), device=args.device)
            logits = model(tokens, block_mask)
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
            if args.train:
                loss.backward()
            print(float(loss))
