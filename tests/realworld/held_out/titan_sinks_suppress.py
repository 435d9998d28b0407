"""Held-out case: torchtitan's GPT-OSS attention with learned sinks, which asks flex_attention for its
log-sum-exp, in a job that sets `torch._dynamo.config.suppress_errors = True`.

Source: pytorch/torchtitan@00b1b07d0bfc973e8c9b177676e7a48b6d52f725 torchtitan/models/gpt_oss/model/model.py
(`Attention.forward`: `output, lse = self.inner_attention(..., return_lse=True)` then the sink rescale
`sigmoid(lse - sinks)`; sliding-window masks on even layers, causal on odd ones) and
pytorch/torchtitan@0012170a0708b751408e6085f970082ecd678d2b torchtitan/models/attention.py
(`FlexAttentionWrapper._compiled_flex_attn = torch.compile(flex_attention, mode="max-autotune-no-cudagraphs")`,
`create_attention_mask` = lru_cache over a compiled create_block_mask). Re-written in our own words,
tiny, no MoE (a plain MLP), on the CPU, inference (flex has no CPU backward). The global
`suppress_errors = True` line is the habit of many training repos (e.g. alibaba/Pai-Megatron-Patch's
Qwen2.5-VL pretrain script sets it at import).

On the CPU, Inductor cannot lower flex_attention with the log-sum-exp output (torch 2.13 raises
NotImplementedError "return_lse is not supported yet" in the CPU lowering); suppress_errors turns that
error into a silent fallback to eager, so the compiled wrapper runs flex's dense kernel every call.
`--no-sinks` (no LSE asked) is the healthy twin.
"""

import argparse
import functools

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

torch._dynamo.config.suppress_errors = True

parser = argparse.ArgumentParser()
parser.add_argument("--no-sinks", action="store_true")
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

DIM, HEADS, HEAD_DIM, LAYERS, VOCAB, SEQ, WINDOW = 64, 4, 16, 2, 128, 256, 64


class FlexAttentionWrapper(nn.Module):
    _compiled_flex_attn = torch.compile(flex_attention, mode="max-autotune-no-cudagraphs")

    def forward(self, q, k, v, *, block_mask, scale=None, return_lse=False):
        return FlexAttentionWrapper._compiled_flex_attn(
            q, k, v, block_mask=block_mask, scale=scale, return_lse=return_lse
        )


def causal(b, h, q, kv):
    return q >= kv


def in_window(b, h, q, kv):
    return q - kv < WINDOW


_compiled_create_block_mask = torch.compile(create_block_mask)


@functools.lru_cache(4)
def create_attention_mask(*a, **kw):
    return _compiled_create_block_mask(*a, **kw)


def rope(x, pos):
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    ang = torch.outer(pos.float(), inv)
    ang = torch.cat((ang, ang), -1)[None, :, None, :]
    x1, x2 = x.chunk(2, -1)
    return x * ang.cos() + torch.cat((-x2, x1), -1) * ang.sin()


class Attention(nn.Module):
    def __init__(self, sinks):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(DIM, HEADS * HEAD_DIM) for _ in range(3))
        self.wo = nn.Linear(HEADS * HEAD_DIM, DIM)
        self.use_sinks = sinks
        self.sinks = nn.Parameter(torch.randn(HEADS) * 0.02)
        self.inner_attention = FlexAttentionWrapper()

    def forward(self, x, mask):
        b, t, _ = x.shape
        pos = torch.arange(t)
        q = rope(self.wq(x).view(b, t, HEADS, HEAD_DIM), pos).transpose(1, 2)
        k = rope(self.wk(x).view(b, t, HEADS, HEAD_DIM), pos).transpose(1, 2)
        v = self.wv(x).view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        if self.use_sinks:
            out, lse = self.inner_attention(q, k, v, block_mask=mask, scale=HEAD_DIM**-0.5, return_lse=True)
            out = out * torch.sigmoid(lse - self.sinks.view(1, -1, 1)).unsqueeze(-1)
        else:
            out = self.inner_attention(q, k, v, block_mask=mask, scale=HEAD_DIM**-0.5)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id, sinks):
        super().__init__()
        self.use_sliding_attention = layer_id % 2 == 0
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention = Attention(sinks)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, masks):
        mask = masks["sliding_window_mask"] if self.use_sliding_attention else masks["basic_mask"]
        x = x + self.attention(self.attention_norm(x), mask)
        return x + self.mlp(self.ffn_norm(x))


class GptOssLike(nn.Module):
    def __init__(self, sinks):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, sinks) for i in range(LAYERS)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def get_attention_masks(self, t):
        return {
            "basic_mask": create_attention_mask(causal, None, None, t, t),
            "sliding_window_mask": create_attention_mask(and_masks(causal, in_window), None, None, t, t),
        }

    def forward(self, tokens, masks):
        x = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            x = layer(x, masks)
        return self.output(self.norm(x))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = GptOssLike(sinks=not args.no_sinks).eval()
    with torch.no_grad():
        for step in range(args.steps):
            tokens = torch.randint(0, VOCAB, (1, SEQ))
            logits = model(tokens, model.get_attention_masks(SEQ))
            print(step, float(logits.float().square().mean()))
