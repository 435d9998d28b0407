"""Real-code case: torchtitan's per-block compile over a model whose attention calls a compiled
flex_attention kept on a class (`FlexAttention._compiled_flex_attn`), reached through the block's
module attributes (`block.attention.inner_attention`).

Sources, re-written here in our own words, tiny sizes:
- pytorch/torchtitan@177b050ca1c54a6264eb7912e5b4778afeabe01d torchtitan/models/llama3/infra/parallelize.py
  (`apply_compile`: `torch.compile(transformer_block, backend=compile_config.backend, fullgraph=True)`
  then `model.layers.register_module(layer_id, transformer_block)`: `--style replace`);
- pytorch/torchtitan@5242bdf7151d8a57ca59ea54c656165d855772be torchtitan/distributed/compile.py
  (`apply_compile`: `transformer_block.compile(backend=compile_config.backend, fullgraph=True)`, in
  place: `--style method`, the default) and torchtitan/models/common/attention.py (`FlexAttention`
  with the class attribute `_compiled_flex_attn = torch.compile(flex_attention, ...)`);
- pytorch/torchtitan@19258f64aba3aa5594ac38b3ee8751f40e05b929 (torchtitan/distributed/compile.py,
  `_maybe_regional_inductor_backend`; "[RL] Enable regional_inductor in FlexAttention", fixing
  torchtitan issue #3497): torchtitan's own fix for `backend="aot_eager"`: `--regional`.

`--backend aot_eager` is the faulty case: the block's compile traces into the class's compiled
flex_attention (dynamo inlines a compiled function called from a graph it is building), so flex
becomes part of each block's aot_eager graph and runs its dense kernel, forward and backward, in
both blocks; the compiled wrapper does not help. `--backend inductor` (the default) is the healthy
twin; `--backend aot_eager --regional` keeps aot_eager and hands only the flex region to Inductor.
On the CPU, flex_attention has no backward (torch raises for inputs that need grad), so the CPU
run is a forward (no grad); `--train` runs forward and backward (`--device cuda --train` on a GPU).
"""

import argparse
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="inductor", choices=["aot_eager", "inductor", "eager"])
parser.add_argument("--style", default="method", choices=["method", "replace"])
parser.add_argument("--regional", action="store_true", help="aot_eager, with the flex region scooped to Inductor")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--seq", type=int, default=128, help="sequence length (2048 and up on a GPU)")
args = parser.parse_args()

DIM, HEADS, HEAD_DIM, SEQ, VOCAB = 64, 4, 16, args.seq, 256
REGIONAL = args.regional


def flex_region():
    """Marks the flex call for regional_inductor when the model's backend is not Inductor."""
    if not REGIONAL:
        return contextlib.nullcontext()
    import torch.fx.traceback as fx_traceback

    return fx_traceback.annotate({"compile_with_inductor": {"inductor_configs": {}}})


class FlexAttention(nn.Module):
    # One compiled flex_attention for every layer, as a class attribute (called by the class's name).
    _compiled_flex_attn = torch.compile(flex_attention)

    def forward(self, q, k, v, *, attention_masks):
        with flex_region():
            return FlexAttention._compiled_flex_attn(q, k, v, block_mask=attention_masks)


def rotary(x):
    """Rotary position embedding on (bs, seq, heads, head_dim), rotating halves."""
    seq = x.shape[1]
    freqs = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device=x.device) / HEAD_DIM))
    angles = torch.outer(torch.arange(seq, device=x.device), freqs)[None, :, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.inner_attention = FlexAttention()

    def forward(self, x, attention_masks):
        bs, seq, _ = x.shape
        q, k, v = (w(x).view(bs, seq, HEADS, HEAD_DIM) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q), rotary(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = self.inner_attention(q, k, v, attention_masks=attention_masks)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, DIM))


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


def compile_backend(backend: str):
    if not REGIONAL:
        return backend
    from torch._dynamo.backends.common import aot_autograd
    from torch.fx.passes.regional_inductor import regional_inductor

    return aot_autograd(fw_compiler=regional_inductor, bw_compiler=regional_inductor)


def apply_compile(model: Transformer, backend: str) -> None:
    """Compile each TransformerBlock (repeated structure: one compile, reused)."""
    backend = compile_backend(backend)
    for layer_id, transformer_block in model.layers.named_children():
        if args.style == "method":
            transformer_block.compile(backend=backend, fullgraph=True)
        else:
            transformer_block = torch.compile(transformer_block, backend=backend, fullgraph=True)
            model.layers.register_module(layer_id, transformer_block)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


model = Transformer().to(args.device)
apply_compile(model, args.backend)
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
