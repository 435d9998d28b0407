"""Real-code case: an attention helper decorated with `torch.compiler.disable` inside a model whose
layers are compiled.

Source, re-written here in our own words, tiny sizes: pytorch/torchtune@1e1ef022e079b682a5e238135d1675f4bb55e1de
torchtune/modules/attention_utils.py (`compile_friendly_flex_attention`: "We cannot do nested compile,
but flex attention only has perf benefits when compiled. To insulate it from the compiler, we wrap it
with compiler.disable ...": `@torch.compiler.disable(recursive=False)` over a call of
`flex_attention_compiled = torch.compile(flex_attention)`; `_sdpa_or_flex_attention` picks it when the
mask is a BlockMask) and torchtune/training/_compile.py (`compile_model`: `m.compile(backend=backend)`
on every TransformerSelfAttentionLayer). The same idea, with the skip recursive graph breaks, is
discussed in pytorch/pytorch#149767.

`--helper disabled` (the default) is the faulty case: the helper that calls flex is decorated with a
plain `@torch.compiler.disable` (recursive) and calls the raw `flex_attention`, as one does to "keep
attention out of the compiled graph"; the layer's graph breaks at the helper and flex runs eagerly,
its dense kernel, in every layer. Healthy twins: `--helper plain` (no decorator: flex is part of each
layer's Inductor graph), `--helper torchtune` (torchtune's `recursive=False` wrapper over a compiled
flex_attention), `--helper shallow` (`recursive=False` over the raw flex_attention: only the helper's
own frame is skipped, flex's frame is compiled by the layer's compile, Inductor by default).
On the CPU, flex_attention has no backward, so the CPU run is a forward (no grad); `--train` runs
forward and backward (`--device cuda --train` on a GPU).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--helper", default="disabled", choices=["disabled", "plain", "torchtune", "shallow"])
parser.add_argument("--backend", default="inductor")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--seq", type=int, default=128, help="sequence length (2048 and up on a GPU)")
args = parser.parse_args()

DIM, HEADS, HEAD_DIM, SEQ, VOCAB = 64, 4, 16, args.seq, 256


@torch.compiler.disable
def disabled_flex_attention(q, k, v, block_mask: BlockMask):
    # keep attention out of the compiled graph
    return flex_attention(q, k, v, block_mask=block_mask)


def plain_flex_attention(q, k, v, block_mask: BlockMask):
    return flex_attention(q, k, v, block_mask=block_mask)


flex_attention_compiled = torch.compile(flex_attention)


@torch.compiler.disable(recursive=False)
def compile_friendly_flex_attention(q, k, v, block_mask: BlockMask):
    return flex_attention_compiled(q, k, v, block_mask=block_mask)


@torch.compiler.disable(recursive=False)
def shallow_disabled_flex_attention(q, k, v, block_mask: BlockMask):
    return flex_attention(q, k, v, block_mask=block_mask)


HELPERS = {
    "disabled": disabled_flex_attention,
    "plain": plain_flex_attention,
    "torchtune": compile_friendly_flex_attention,
    "shallow": shallow_disabled_flex_attention,
}
attention_call = HELPERS[args.helper]


def rotary(x):
    """Rotary position embedding on (bs, heads, seq, head_dim), rotating halves."""
    seq = x.shape[2]
    freqs = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device=x.device) / HEAD_DIM))
    angles = torch.outer(torch.arange(seq, device=x.device), freqs)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], dim=-1)


class MultiHeadAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(DIM, DIM, bias=False)
        self.k_proj = nn.Linear(DIM, DIM, bias=False)
        self.v_proj = nn.Linear(DIM, DIM, bias=False)
        self.output_proj = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = attention_call(rotary(q), rotary(k), v, block_mask=mask)
        return self.output_proj(out.transpose(1, 2).reshape(b, s, DIM))


class TransformerSelfAttentionLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sa_norm = nn.RMSNorm(DIM)
        self.attn = MultiHeadAttention()
        self.mlp_norm = nn.RMSNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, mask):
        h = x + self.attn(self.sa_norm(x), mask)
        return h + self.mlp(self.mlp_norm(h))


class TransformerDecoder(nn.Module):
    def __init__(self, n_layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([TransformerSelfAttentionLayer() for _ in range(n_layers)])
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, mask):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, mask)
        return self.output(self.norm(h))


def compile_model(model: TransformerDecoder, backend: str) -> None:
    """Per-layer compile, in place."""
    for m in reversed(list(model.modules())):
        if isinstance(m, TransformerSelfAttentionLayer):
            m.compile(backend=backend)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


model = TransformerDecoder().to(args.device)
compile_model(model, args.backend)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
mask = create_block_mask(causal, None, None, SEQ, SEQ, device=args.device)
with torch.set_grad_enabled(args.train):
    for _ in range(args.steps):
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), device=args.device)
        logits = model(tokens[:, :-1], mask)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        if args.train:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
