"""Held-out case: Hugging Face `generate()` on a Llama with attn_implementation="flex_attention" and no
user torch.compile: decode-time flex with a KV cache that grows one token per step.

Source: transformers==5.25.0, transformers/integrations/flex_attention.py (`WrappedFlexAttention`: a
singleton that compiles flex_attention once, `torch.compile(flex_attention)` when not training;
`compile_friendly_flex_attention` calls it unless dynamo is already compiling; the flex BlockMask comes
from a compiled create_block_mask) and the usual generation call `model.generate(ids, max_new_tokens=...)`.
Written in our own words around a tiny random-weight LlamaConfig, on the CPU, greedy decoding.

Healthy: transformers routes every attention call through its own compiled flex_attention; the prefill
(128 tokens) compiles statically, the first decode step (q_len 1, kv 129) recompiles once with dynamic
kv length, and every later step reuses it: no flex call runs dense. `--eager-flex` is the faulty twin:
it swaps transformers' compiled wrapper for the plain flex_attention (as an uncompiled custom attention
function would be), so every layer runs flex dense at every step.
"""

import argparse

import torch
from torch.nn.attention.flex_attention import flex_attention
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser()
parser.add_argument("--eager-flex", action="store_true")
parser.add_argument("--new_tokens", type=int, default=4)
args = parser.parse_args()

if args.eager_flex:
    import transformers.integrations.flex_attention as hf_flex

    hf_flex.compile_friendly_flex_attention = lambda q, k, v, training=False, **kw: flex_attention(q, k, v, **kw)

config = LlamaConfig(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=256,
)

if __name__ == "__main__":
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention").eval()
    prompt = torch.randint(0, config.vocab_size, (1, 128))
    out = model.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False)
    print(out[0, -args.new_tokens :].tolist())
