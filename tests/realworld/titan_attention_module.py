"""Model module for the launcher_rebound.py case (imported, never run): a tiny torchtitan-style
decoder whose attention calls a compiled flex_attention kept on a class, by the class's name.

Source, re-written here in our own words, tiny sizes: pytorch/torchtitan@06562f393dba9e79a37d733ac3487fc89b26c858
torchtitan/models/common/attention.py (`FlexAttention._compiled_flex_attn = torch.compile(flex_attention,
options=FlexAttention.inductor_configs)`, called as `FlexAttention._compiled_flex_attn(q, k, v,
block_mask=...)` in `forward`). The class attribute is what a launcher may rebind (see launcher_rebound.py).
"""

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import flex_attention

DIM, HEADS, HEAD_DIM, SEQ, VOCAB = 64, 4, 16, 128, 256


class FlexAttention(nn.Module):
    # One compiled flex_attention shared by every layer.
    _compiled_flex_attn = torch.compile(flex_attention)

    def forward(self, q, k, v, *, attention_masks):
        return FlexAttention._compiled_flex_attn(q, k, v, block_mask=attention_masks)


def rotary(x):
    """Rotary position embedding on (bs, heads, seq, head_dim), rotating halves."""
    seq = x.shape[2]
    freqs = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device=x.device) / HEAD_DIM))
    angles = torch.outer(torch.arange(seq, device=x.device), freqs)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.inner_attention = FlexAttention()

    def forward(self, x, attention_masks):
        b, s, _ = x.shape
        q, k, v = self.wqkv(x).view(b, s, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        out = self.inner_attention(rotary(q), rotary(k), v, attention_masks=attention_masks)
        return self.wo(out.transpose(1, 2).reshape(b, s, DIM))


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, attention_masks):
        h = x + self.attention(self.attention_norm(x), attention_masks)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, n_layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): TransformerBlock() for i in range(n_layers)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, attention_masks):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, attention_masks)
        return self.output(self.norm(h))


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx
