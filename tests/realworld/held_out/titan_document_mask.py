"""Held-out case: torchtitan's packed-document attention: a document mask_mod rebuilt from the EOS
positions of every batch, a BlockMask made by a compiled create_block_mask, and flex_attention called
through the class-level compiled wrapper; the model itself is not compiled.

Source: pytorch/torchtitan@0012170a0708b751408e6085f970082ecd678d2b torchtitan/models/attention.py
(`FlexAttentionWrapper._compiled_flex_attn = torch.compile(flex_attention, mode="max-autotune-no-cudagraphs")`;
`get_document_mask_mod(batch, eos_id)`: a closure over the per-batch `sequence_indices`;
`create_attention_mask` = functools.lru_cache over `torch.compile(create_block_mask)`; masks combined with
`and_masks(causal, document)`), in a step loop over fresh packed batches as torchtitan's trainer does.
Re-written in our own words, tiny; on the CPU forward only (flex has no CPU backward);
`--device cuda --train` runs forward and backward.

Healthy: each step makes a new closure (same code, new captured tensor); dynamo treats the captured tensor
as a graph input, so the compiled wrapper neither recompiles nor falls back, and every flex call is fused,
even with more steps than the recompile limit (8). `--eager-wrapper` is the faulty twin: the wrapper
calls the plain flex_attention.
"""

import argparse
import functools

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--eager-wrapper", action="store_true")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward: GPU only)")
args = parser.parse_args()

DIM, HEADS, LAYERS, VOCAB, SEQ, EOS = 64, 4, 2, 128, 256, 0


class FlexAttentionWrapper(nn.Module):
    _compiled_flex_attn = (
        flex_attention if args.eager_wrapper else torch.compile(flex_attention, mode="max-autotune-no-cudagraphs")
    )

    def forward(self, q, k, v, *, block_mask, scale=None):
        return FlexAttentionWrapper._compiled_flex_attn(q, k, v, block_mask=block_mask, scale=scale)


def _causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def get_document_mask_mod(batch, eos_id):
    eos = batch == eos_id
    eos[:, -1] = True
    cumulative = torch.cumsum(torch.where(eos, 1, 0), dim=1)
    sequence_indices = torch.zeros_like(cumulative, dtype=torch.int32)
    sequence_indices[:, 1:] = cumulative[:, :-1]

    def document_mask(b, h, q_idx, kv_idx):
        return sequence_indices[b, q_idx] == sequence_indices[b, kv_idx]

    return document_mask


_compiled_create_block_mask = torch.compile(create_block_mask)


@functools.lru_cache(4)
def create_attention_mask(*a, **kw):
    return _compiled_create_block_mask(*a, **kw)


def rope(x):
    t, d = x.shape[-2], x.shape[-1]
    pos, dims = torch.arange(t, device=x.device).float(), torch.arange(0, d, 2, device=x.device).float()
    ang = torch.outer(pos, 1.0 / (10000 ** (dims / d)))
    ang = torch.cat((ang, ang), -1)
    x1, x2 = x.chunk(2, -1)
    return x * ang.cos() + torch.cat((-x2, x1), -1) * ang.sin()


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.inner_attention = FlexAttentionWrapper()

    def forward(self, x, block_mask):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, HEADS, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = self.inner_attention(rope(q), rope(k), v, block_mask=block_mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, DIM))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention = Attention()
        self.feed_forward = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, block_mask):
        x = x + self.attention(self.attention_norm(x), block_mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def get_attention_masks(self, tokens):
        mask_mod = and_masks(_causal_mask, get_document_mask_mod(tokens, EOS))
        b, t = tokens.shape
        return create_attention_mask(mask_mod, b, None, t, t, device=str(tokens.device))

    def forward(self, tokens, block_mask):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, block_mask)
        return self.output(self.norm(h))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Transformer().to(args.device).train(args.train)
    with torch.set_grad_enabled(args.train):
        for _ in range(args.steps):
            tokens = torch.randint(1, VOCAB, (2, SEQ), device=args.device)
            tokens[torch.rand(tokens.shape, device=args.device) < 0.02] = EOS  # packed documents
            logits = model(tokens, model.get_attention_masks(tokens))
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
            if args.train:
                loss.backward()
        print(float(loss))
