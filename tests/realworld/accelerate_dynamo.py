"""Real-code case: accelerate's Accelerator compiling the model it prepares
(`Accelerator(dynamo_plugin=TorchDynamoPlugin(backend=...))`) on a tiny Llama (transformers, random
weights) with attn_implementation="flex_attention".

Source: accelerate==1.16.0 (src/accelerate/accelerator.py: `dynamo_backend=` becomes
`TorchDynamoPlugin(backend=dynamo_backend)`, and `prepare_model` ends with `torch.compile(model,
**self.state.dynamo_plugin.to_kwargs())`, or `compile_regions(...)` with `use_regional_compilation=True`;
src/accelerate/utils/dataclasses.py `TorchDynamoPlugin`), the loop of accelerate's examples
(`accelerator.prepare(model, optimizer)`, `accelerator.backward(loss)`). Written in our own words,
tiny sizes.

`--backend aot_eager` is the faulty case (the whole model compiled with aot_eager: every layer's flex
runs its dense kernel); `--backend inductor` is the healthy twin; `--regional` compiles the repeated
decoder layers instead of the whole model (accelerate's regional compilation), same backend rule.
`--plain-arg` passes `Accelerator(dynamo_backend=...)` instead of a plugin. On the CPU flex has no
backward, so the CPU run is a forward (no grad); `--train` adds `accelerator.backward(loss)` and an
optimizer step (`--device cuda --train` on a GPU).
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import TorchDynamoPlugin
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="inductor")
parser.add_argument("--regional", action="store_true", help="TorchDynamoPlugin(use_regional_compilation=True)")
parser.add_argument("--plain-arg", action="store_true", help="Accelerator(dynamo_backend=...)")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="forward and backward (flex has no CPU backward)")
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

config = LlamaConfig(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=256,
    use_cache=False,
)
model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
if args.plain_arg:
    accelerator = Accelerator(cpu=args.device == "cpu", dynamo_backend=args.backend)
else:
    plugin = TorchDynamoPlugin(backend=args.backend, use_regional_compilation=args.regional)
    accelerator = Accelerator(cpu=args.device == "cpu", dynamo_plugin=plugin)
model, optimizer = accelerator.prepare(model, optimizer)
model.train(args.train)
with torch.set_grad_enabled(args.train):
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (2, args.seq), device=accelerator.device)
        loss = model(input_ids=ids, labels=ids).loss
        if args.train:
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
