"""Real-code case: HF Trainer with `TrainingArguments(torch_compile=True, torch_compile_backend=...)` on a
tiny Llama (transformers, random weights) with attn_implementation="flex_attention".

Source: transformers==5.25.0 (src/transformers/training_args.py `torch_compile_backend`: "Backend for
`torch.compile()`. If set, automatically enables `torch_compile`"; src/transformers/trainer.py builds
`accelerate.utils.TorchDynamoPlugin(backend=self.args.torch_compile_backend, ...)` for its Accelerator)
and accelerate==1.16.0 (src/accelerate/accelerator.py `prepare_model`: `torch.compile(model,
**self.state.dynamo_plugin.to_kwargs())`). Written in our own words, tiny sizes, CPU (`use_cpu=True`).

`--backend aot_eager` is the faulty case: the whole model is compiled with aot_eager, which never
reaches Inductor, so each layer's flex_attention (transformers passes the raw function into the
model's graph) runs its dense kernel; `--backend inductor` is the healthy twin. On the CPU flex has no
backward, so the default runs `trainer.evaluate()` (3 batches, forward only, compiled the same way);
`--train` runs `trainer.train()` for 3 steps (on a GPU: `--device cuda --train`; on the CPU it raises).
"""

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="inductor")
parser.add_argument("--device", default="cpu")
parser.add_argument("--train", action="store_true", help="trainer.train() (flex has no CPU backward)")
parser.add_argument("--seq", type=int, default=128)
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


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        ids = torch.randint(0, config.vocab_size, (args.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


with tempfile.TemporaryDirectory() as out:
    training_args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        max_steps=3,
        torch_compile=True,
        torch_compile_backend=args.backend,
        use_cpu=args.device == "cpu",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(), eval_dataset=RandomTokens())
    if args.train:
        trainer.train()
    else:
        trainer.evaluate()
