"""A user script whose flex_attention calls run dense, for the fix replay (hooks/fix_replay.py): after
the traced run, trace-attention replays one call of each dense site through torch.compile(flex_attention).

Default: two attention modules calling flex_attention raw, one in float32 with a causal mask and a
per-head bias its score_mod closes over (the replay proves the fix), one in float64 (Inductor's CPU
flex kernel takes float32, float16 and bfloat16 only: the compiled call raises, so not proven).
`--debug-score-mod`: one raw call under flex_attention's compile-debug switch, whose score_mod
counts its own calls in a Python list (a debugging aid); dynamo cannot trace that into a graph, so
even the compiled call runs dense and the fix is not proven.
`--device cuda --seq N --backward`: one raw bfloat16 call on the GPU with its backward, for
the peak memory of the dense call against the fused one.
"""

import argparse

import torch
import torch.nn.attention.flex_attention as flex_module
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--backward", action="store_true")
parser.add_argument("--debug-score-mod", action="store_true")
args = parser.parse_args()


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Attention(torch.nn.Module):
    def __init__(self, heads: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.heads, self.dtype = heads, dtype
        self.bias = torch.linspace(-1.0, 1.0, heads, dtype=dtype, device=args.device)

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        batch, length, width = x.shape
        q = x.to(self.dtype).view(batch, length, self.heads, width // self.heads).transpose(1, 2)
        bias = self.bias

        def per_head(score, b, h, q_idx, kv_idx):
            return score + bias[h]

        return flex_attention(q, q, q, score_mod=per_head, block_mask=mask)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proven = Attention(4, torch.float32)
        self.float64 = Attention(4, torch.float64)

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        return self.proven(x, mask).float() + self.float64(x, mask).float()


calls = []


def counted(score, b, h, q_idx, kv_idx):
    calls.append(1)  # plain Python: runs under vmap, not under dynamo
    return score


mask = create_block_mask(causal, None, None, args.seq, args.seq, device=args.device)
if args.debug_score_mod:
    flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    q = torch.randn(1, 4, args.seq, 16)
    flex_attention(q, q, q, score_mod=counted, block_mask=mask)
elif args.device == "cuda":
    dtype = torch.bfloat16
    q, k, v = (torch.randn(1, 8, args.seq, 64, device="cuda", dtype=dtype, requires_grad=args.backward) for _ in "qkv")
    out = flex_attention(q, k, v, block_mask=mask)
    if args.backward:
        out.sum().backward()
else:
    with torch.no_grad():
        Model()(torch.randn(1, args.seq, 64), mask)
