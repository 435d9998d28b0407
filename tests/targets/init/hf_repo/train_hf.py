"""An HF-Trainer-like script: a tiny random-weight Llama asked for transformers' flex attention.
COMPILE is rewritten by the faulty twin (tests/integration/test_init.py) to compile the model with
aot_eager, which runs every layer's flex_attention dense."""

import torch
from transformers import LlamaConfig, LlamaModel


def main() -> None:
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
    )
    torch.manual_seed(0)
    model = LlamaModel._from_config(config, attn_implementation="flex_attention").eval()
    model = model  # COMPILE
    head = torch.nn.Linear(64, 1)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    for _step in range(4):
        ids = torch.randint(0, 128, (1, 128))
        with torch.no_grad():
            hidden = model(input_ids=ids).last_hidden_state
        head(hidden).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
