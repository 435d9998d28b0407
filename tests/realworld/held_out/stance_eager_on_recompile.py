"""Held-out case: an evaluation loop over length buckets that sets
`torch.compiler.set_stance("eager_on_recompile")` so that new shapes do not pay for a recompile.

Source: pytorch/tutorials@15379ce41cb30c2526abedb47140709432be3245
recipes_source/torch_compiler_set_stance_tutorial.py ("If erroring out is too disruptive, we can use
"eager_on_recompile" instead ... when one is required, we'd rather pay the cost of running eagerly over
the cost of recompilation"), applied to a compiled flex_attention decoder evaluated on bucketed
lengths (the BlockMask is built per bucket, outside the compiled model, as attention-gym's examples do).
Re-written in our own words, tiny, on the CPU, evaluation (no backward).

The first bucket (256) compiles; every batch of another length would need a recompile, so under the
stance it runs the model eagerly, and flex_attention with it runs its dense kernel in every layer.
Batches of length 256 reuse the compiled graph. `--stance default` is the healthy twin: the second
length recompiles once with dynamic shapes and every batch is fused.
"""

import argparse

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--stance", default="eager_on_recompile")
args = parser.parse_args()

DIM, HEADS, LAYERS, VOCAB = 64, 4, 2, 128
BUCKETS = [256, 384, 256, 512]


def causal(b, h, q, kv):
    return q >= kv


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.ff = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, block_mask):
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (z.view(b, t, HEADS, -1).transpose(1, 2) for z in self.qkv(h).chunk(3, -1))
        a = flex_attention(q, k, v, block_mask=block_mask)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, DIM))
        return x + self.ff(self.norm2(x))


class Decoder(nn.Module):
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


@torch.no_grad()
def evaluate(model, batches):
    losses = []
    for tokens in batches:
        t = tokens.shape[1]
        mask = create_block_mask(causal, None, None, t, t, device="cpu")
        logits = model(tokens, mask)
        losses.append(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()))
    return torch.stack(losses).mean()


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.compile(Decoder().eval())
    batches = [torch.randint(0, VOCAB, (1, n)) for n in BUCKETS]
    evaluate(model, batches[:1])  # warm-up: compiles for the first bucket
    with torch.compiler.set_stance(args.stance):
        print(float(evaluate(model, batches)))
