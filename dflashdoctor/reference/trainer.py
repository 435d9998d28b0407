"""The reference DFlash trainer: the shape of the original run, small enough to start in seconds.

Data-parallel pairs run from a thread pool, as in the original run; each pair owns a frozen target
(the Qwen3.5-style target of `target_pairs`, FLA's gated DeltaNet on a GPU) and a DFlash drafter
(`drafter_step`). One step: every pair runs its target forward (no grad), feeds the last hidden
states to its drafter as context, runs the drafter forward and, where flex_attention has a
backward (a GPU), the backward; then one optimizer step over every pair's drafter.

Fault switches (`--fault`), each one of the original failures:
- `eager-wrapper`: the drafter's wrapper compiled with backend="eager": dense forward and backward;
- `hf-flex-path`: the drafter calls transformers' own flex_attention path instead of the wrapper;
- `concurrent-target`: the pairs' target forwards run at once (the fix holds them to one at a time),
  which shares FLA's autotuners between threads;
- `recompile-mask`: a score_mod reads a global that changes with each step's context length, so
  dynamo recompiles until its limit, then runs flex_attention eagerly (dense).

Drafter steps that compile (the first, and every one under `recompile-mask`) run one pair at a time:
torch marks FX tracing with a process-global flag, so a thread calling a compiled function while
another thread compiles raises "Detected that you are using FX to symbolically trace a
dynamo-optimized function" (seen on an H200 with torch 2.11). The target forwards, which compile
nothing, still run from the pool in every step, so `concurrent-target` overlaps the first, cold ones.

Run it as `python -m dflashdoctor.reference.trainer [--fault F] [--steps N] ...`; under
`dflashdoctor run -- python -m dflashdoctor.reference.trainer` every fault is found.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

FAULTS = ("none", "eager-wrapper", "hf-flex-path", "concurrent-target", "recompile-mask")
_RECOMPILE_STRIDE = 128  # the context shrinks by this much each step under recompile-mask


class Pair(nn.Module):
    """One data-parallel pair: its target (frozen, not a submodule: it is not trained) and drafter."""

    def __init__(self, worker: int, device: str, dtype: torch.dtype, fault: str, scale: str) -> None:
        super().__init__()
        from dflashdoctor.models import build_config
        from dflashdoctor.reference import target_pairs
        from dflashdoctor.reference.drafter_step import DFlashDrafter

        self.worker, self.device = worker, device
        self.target = [target_pairs.target_for(worker, device)]  # a list: kept out of the module tree
        config = build_config("qwen27b-dflash", scale)
        drafter_fault = fault if fault in ("eager-wrapper", "hf-flex-path") else None
        self.drafter = DFlashDrafter(
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            drafter_fault,
        )
        if fault == "recompile-mask":
            from dflashdoctor.reference.faults import global_length

            for layer in self.drafter.layers:
                # torch's ModuleList is not generic: its items are typed Module; these are ModuleDicts
                layer["self_attn"].attention = global_length.flex_attention_forward
        self.project = nn.Linear(self.target[0].config.hidden_size, config.hidden_size)
        self.hidden = config.hidden_size
        self.to(device=device, dtype=dtype)

    def target_forward(self, tokens: int) -> torch.Tensor:
        target = self.target[0]
        generator = torch.Generator().manual_seed(1000 + self.worker)
        ids = torch.randint(0, target.config.vocab_size, (1, tokens), generator=generator).to(self.device)
        with torch.no_grad():
            return target(input_ids=ids, output_hidden_states=True).hidden_states[-1]

    def drafter_step(self, hidden: torch.Tensor, context_len: int, blocks: int, backward: bool) -> float:
        from dflashdoctor.reference.drafter import drafter_block_mask
        from dflashdoctor.reference.drafter_step import BLOCK_SIZE

        repeats = -(-context_len // hidden.shape[1])  # a long context tiles the target's states
        context = self.project(hidden.repeat(1, repeats, 1)[:, :context_len])
        q_len = blocks * BLOCK_SIZE
        draft = torch.randn(1, q_len, self.hidden, device=self.device, dtype=context.dtype)
        mask = drafter_block_mask(q_len, context_len + q_len, self.device)
        with torch.set_grad_enabled(backward):
            loss = self.drafter(draft, context, mask).float().pow(2).mean()
            if backward:
                loss.backward()
        return float(loss)


def build_pairs(args: argparse.Namespace) -> list[Pair]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("trainer: --device cuda, but torch sees no CUDA device here")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dtype = torch.bfloat16 if cuda else torch.float32
    scale = args.scale if args.scale != "auto" else ("full" if cuda else "tiny")
    devices = [f"cuda:{i % torch.cuda.device_count()}" if cuda else "cpu" for i in range(args.pairs)]
    return [Pair(i, device, dtype, args.fault, scale) for i, device in enumerate(devices)]


def train(args: argparse.Namespace) -> list[float]:
    pairs = build_pairs(args)
    backward = pairs[0].device.startswith("cuda")  # flex_attention has no backward on the CPU
    optimizer = torch.optim.SGD([p for pair in pairs for p in pair.parameters()], lr=1e-4)
    target_turn = threading.Lock()  # the fix: one target forward at a time
    concurrent = args.fault == "concurrent-target"
    tokens = args.tokens or (2048 if backward else 256)
    context_len = args.context_len or (8192 if backward else 512)
    step_times = []

    def target_step(pair: Pair) -> torch.Tensor:
        with contextlib.nullcontext() if concurrent else target_turn:
            return pair.target_forward(tokens)

    def pair_step(pair: Pair, step: int) -> float:
        return drafter_step(pair, target_step(pair), step)

    def drafter_step(pair: Pair, hidden: torch.Tensor, step: int) -> float:
        length = context_len - _RECOMPILE_STRIDE * step if args.fault == "recompile-mask" else context_len
        return pair.drafter_step(hidden, max(length, _RECOMPILE_STRIDE), args.blocks, backward)

    with ThreadPoolExecutor(max_workers=len(pairs), thread_name_prefix="pair") as pool:
        for step in range(args.steps):
            started = time.perf_counter()
            if step == 0 or args.fault == "recompile-mask":  # drafter steps that compile: one pair at a time
                hidden = list(pool.map(target_step, pairs))
                losses = [drafter_step(pair, h, step) for pair, h in zip(pairs, hidden, strict=True)]
            else:
                losses = list(pool.map(pair_step, pairs, [step] * len(pairs)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if backward:
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - started)
            print(f"step {step}: loss {sum(losses) / len(losses):.4f}, {step_times[-1] * 1000:.1f} ms", flush=True)
    return step_times


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--scale", choices=("auto", "tiny", "full"), default="auto", help="drafter size")
    parser.add_argument("--tokens", type=int, default=None, help="target tokens [cuda 2048, cpu 256]")
    parser.add_argument("--context-len", type=int, default=None, help="drafter context [cuda 8192, cpu 512]")
    parser.add_argument("--blocks", type=int, default=8, help="draft blocks of 16 tokens (8: 128 queries)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Any:
    return train(parse(argv))


if __name__ == "__main__":
    main()
