"""Held-out case: FSDP2 (`fully_shard` on every layer and on the root, meta-device init) around a
flex_attention Transformer, the sharded model then compiled as a whole.

Source: pytorch/examples@5e960d874d24e416f25b3a6553eeaab9b451ff9f distributed/FSDP2/example.py
(`with torch.device("meta"): model = Transformer(...)`, `for layer in model.layers: fully_shard(layer)`,
`fully_shard(model)`, `model.to_empty(device=...)`, `model.reset_parameters()`, then the step loop),
with the example's attention swapped for flex_attention (plus Llama-style RoPE) and
`torch.compile(model)` after sharding (the order the FSDP2 docs recommend). Re-written in our own
words: one process, gloo, world_size=1, tiny, on the CPU; forward only (flex has no CPU backward), so
the loop is an evaluation pass.

Healthy: dynamo cannot trace the root's frame through FSDP2's unshard hooks (its compile attempt ends
Unsupported on a torch.compiler.disable'd FSDP function), but the layers' forward frames it then meets
are compiled (one graph, reused by both layers), so every flex_attention is fused.
`--eager` is the faulty twin: the same sharded model without torch.compile runs flex dense in each layer.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--eager", action="store_true")
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

DIM, HEADS, LAYERS, VOCAB, SEQ = 64, 4, 2, 128, 256


def causal(b, h, q, kv):
    return q >= kv


def rotary(x):
    # Llama-style rotate-half RoPE. It also keeps q a computed 4-D buffer: torch 2.13's CPU Inductor
    # flex template fails to lower a q that is a bare view of a 2-D matmul output
    t, d = x.shape[-2], x.shape[-1]
    ang = torch.outer(torch.arange(t).float(), 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
    ang = torch.cat((ang, ang), -1)
    x1, x2 = x.chunk(2, -1)
    return x * ang.cos() + torch.cat((-x2, x1), -1) * ang.sin()


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x, block_mask):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, HEADS, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q), rotary(k)
        y = flex_attention(q, k, v, block_mask=block_mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, DIM))

    def reset_parameters(self):
        for w in (self.wq, self.wk, self.wv, self.wo):
            w.reset_parameters()


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attention = Attention()
        self.w1, self.w2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x, block_mask):
        x = x + self.attention(self.attention_norm(x), block_mask)
        return x + self.w2(torch.relu(self.w1(self.ffn_norm(x))))

    def reset_parameters(self):
        for m in (self.attention_norm, self.ffn_norm, self.attention, self.w1, self.w2):
            m.reset_parameters()


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(TransformerBlock() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, block_mask):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, block_mask)
        return self.output(self.norm(h))

    def reset_parameters(self):
        for m in (self.tok_embeddings, self.norm, self.output, *self.layers):
            m.reset_parameters()


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cpu")
    model.reset_parameters()
    model.eval()
    if not args.eager:
        model = torch.compile(model)
    block_mask = create_block_mask(causal, None, None, SEQ, SEQ, device="cpu")
    with torch.no_grad():
        for _ in range(args.steps):
            x = torch.randint(0, VOCAB, (2, SEQ))
            print(float(model(x, block_mask).float().square().mean()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
