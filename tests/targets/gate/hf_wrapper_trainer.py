"""A trainer around a tiny random-weight HF Llama (transformers, built from its config) whose
attention goes through the team's own flex_attention wrapper, registered with transformers'
AttentionInterface: compiled with Inductor (healthy), or with `--backend eager`, which compiles
nothing and so runs flex_attention's dense kernel. flex_attention has no backward on the CPU: the
model runs without grad and a head over its hidden states is trained, one optimizer step a batch."""

import argparse

import torch
from torch.nn.attention.flex_attention import flex_attention
from transformers import AttentionInterface, LlamaConfig, LlamaModel

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="inductor")
args = parser.parse_args()

compiled_flex = torch.compile(flex_attention, backend=args.backend, dynamic=False)  # WRAPPER_LINE


def team_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    groups = query.shape[1] // key.shape[1]
    out = compiled_flex(query, key, value, scale=scaling, enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("team_flex", team_attention)
config = LlamaConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    attn_implementation="team_flex",
)
torch.manual_seed(0)
model = LlamaModel(config).eval()
head = torch.nn.Linear(64, 1)
optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
for _step in range(3):
    ids = torch.randint(0, 128, (1, 128))
    with torch.no_grad():
        hidden = model(input_ids=ids).last_hidden_state
    head(hidden).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
