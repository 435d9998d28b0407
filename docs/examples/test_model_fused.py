"""A model test that fails the moment the model's attention stops running fused.

    python3 -m pytest docs/examples/test_model_fused.py

The marker comes from dflashdoctor's pytest plugin (installed with dflashdoctor). A transformers
model built with attn_implementation="flex_attention" goes through transformers' own compiled
flex_attention; if an upgrade, a config change or your own wrapper sends a layer to the dense
kernel, this test fails and its message names the layer, the line, the cause and the fix.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture
def model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation="flex_attention").eval()


@pytest.mark.flex_fused
def test_forward_runs_fused_attention(model: LlamaForCausalLM) -> None:
    with torch.no_grad():
        logits = model(torch.randint(0, 256, (1, 128))).logits
    assert logits.shape == (1, 128, 256)
