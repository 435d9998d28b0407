"""A user training script: a tiny HF Qwen3 on transformers' flex path, plus a drafter of its own that
calls its own compiled flex_attention wrapper. trace-attention should list both paths as separate sites.

Flags: --raw makes the drafter call flex_attention itself (dense); --fail raises after the steps;
--compile-models wraps both models in torch.compile, so every attention call runs inside an outer
compiled region.
"""

import sys

import torch
from torch.nn.attention.flex_attention import flex_attention
from transformers import AutoModelForCausalLM, Qwen3Config

compiled_flex = torch.compile(flex_attention)


class DraftAttention(torch.nn.Module):
    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape
        q = hidden.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        attention = flex_attention if "--raw" in sys.argv else compiled_flex
        return attention(q, q, q)


class Drafter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = DraftAttention(heads=4, head_dim=16)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.attn(hidden)


def main() -> None:
    config = Qwen3Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=256,
    )
    target = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention")
    drafter = Drafter()
    if "--compile-models" in sys.argv:
        target, drafter = torch.compile(target), torch.compile(drafter)
    with torch.no_grad():  # flex_attention has no CPU backward
        target(input_ids=torch.randint(0, 256, (1, 32)))
        drafter(torch.randn(1, 32, 64))
    if "--fail" in sys.argv:
        raise RuntimeError("loss went NaN at step 1")


if __name__ == "__main__":
    main()
