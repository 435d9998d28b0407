"""Held-out case: a LightningModule whose attention is flex_attention, passed to the Trainer as
`torch.compile(model)` and run through `trainer.validate` and `trainer.predict`.

Source: lightning==2.6.6, docs "Speed up models by compiling them" (`model = torch.compile(model)`,
`trainer.fit(model)`) and lightning/pytorch/utilities/compile.py (`_maybe_unwrap_optimized` ->
`from_compiled`: the Trainer unwraps the OptimizedModule and re-wraps `forward`, `training_step`,
`validation_step`, `test_step` and `predict_step` of the LightningModule with the same dynamo context).
The model is written in our own words, tiny, on the CPU; validate/predict only (no backward: flex has none
on the CPU; predict runs under torch.inference_mode).

Healthy: the Trainer calls the compiled `validation_step` / `predict_step`, so every flex_attention runs
inside a compiled graph. `--no-compile` is the faulty twin (the plain module: flex dense in each layer
for every batch).
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--no-compile", action="store_true")
args = parser.parse_args()

DIM, HEADS, LAYERS, VOCAB, SEQ = 64, 4, 2, 128, 256


def causal(b, h, q, kv):
    return q >= kv


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x, block_mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        y = flex_attention(q, k, v, block_mask=block_mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, DIM))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = SelfAttention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x, block_mask):
        x = x + self.attn(self.ln1(x), block_mask)
        return x + self.mlp(self.ln2(x))


class LitLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)
        self.block_mask = create_block_mask(causal, None, None, SEQ, SEQ, device="cpu")

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.block_mask)
        return self.head(x)

    def validation_step(self, batch, batch_idx):
        (tokens,) = batch
        logits = self(tokens)
        loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        self.log("val_loss", loss)
        return loss

    def predict_step(self, batch, batch_idx):
        (tokens,) = batch
        return self(tokens).argmax(-1)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    model = LitLM()
    if not args.no_compile:
        model = torch.compile(model)
    data = DataLoader(TensorDataset(torch.randint(0, VOCAB, (4, SEQ))), batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    print(trainer.validate(model, data, verbose=False))
    print(len(trainer.predict(model, data)))
