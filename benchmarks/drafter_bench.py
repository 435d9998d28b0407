"""What the drafter-step benchmarks share: their options and the reference drafter they time.

The reference drafter at the qwen27b-dflash preset (full scale on CUDA, tiny on CPU); one step is
forward and, on CUDA, backward (flex_attention has no backward on the CPU).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from dflashdoctor.models import build_config
from dflashdoctor.reference.drafter_step import make_drafter_step


def drafter_options(description: str, extra: list[tuple[str, dict[str, Any]]] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    for flag, settings in extra or []:
        parser.add_argument(flag, **settings)
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50, help="steps per timed sample")
    parser.add_argument("--context", type=int, default=4096, help="context tokens before the draft blocks")
    parser.add_argument("--blocks", type=int, default=16, help="draft blocks of 16 tokens")
    return parser.parse_args()


def drafter_step(args: argparse.Namespace, fault: str | None = None) -> tuple[Any, torch.nn.Module, Callable[[], None]]:
    """The preset's config, the drafter and its step, at the shape the options give; `fault`
    "hf-flex-path" routes its attention through transformers' own flex integration."""
    cuda = args.device == "cuda"
    config = build_config("qwen27b-dflash", "full" if cuda else "tiny")
    dtype = torch.bfloat16 if cuda else torch.float32
    drafter, step = make_drafter_step(
        config, args.device, dtype, fault, backward=cuda, blocks=args.blocks, context_len=args.context
    )
    return config, drafter, step


def ratio_interval(plain: list[float], other: list[float], rounds: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of median(other) / median(plain), resampling each mode's samples."""
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(other, k=len(other))) / statistics.median(rng.choices(plain, k=len(plain)))
        for _ in range(rounds)
    )
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def abba(timed: Callable[[str], float], other: str, repeats: int) -> dict[str, list[float]]:
    """`timed(mode)` samples of "plain" and `other`, each repeat in the order plain, other, other,
    plain, so that drift in clocks or load hits both modes alike."""
    times: dict[str, list[float]] = {"plain": [], other: []}
    for _ in range(repeats):
        for mode in ("plain", other, other, "plain"):
            times[mode].append(timed(mode))
    return times


def print_ratio(times: dict[str, list[float]], other: str, label: str) -> None:
    """The medians per step of "plain" and `other` (headed `label`), their ratio with its 95%
    interval, then every sample."""
    plain_ms, other_ms = (statistics.median(times[k]) * 1e3 for k in ("plain", other))
    low, high = ratio_interval(times["plain"], times[other])
    heading = f"{label} ms/step"
    width = len(heading) + 1
    print(f"{'plain ms/step':>14} {heading:>{width}} {'ratio':>6} {'95% interval':>16}")
    print(f"{plain_ms:14.3f} {other_ms:{width}.3f} {other_ms / plain_ms:6.3f}   [{low:.3f}, {high:.3f}]")
    for name in ("plain", other):
        print(f"  {name}: " + ", ".join(f"{t * 1e3:.3f}" for t in times[name]))


def use(drafter: torch.nn.Module, wrapper: Callable[..., torch.Tensor]) -> None:
    """Every layer calls `wrapper` for its attention."""
    for layer in drafter.layers:
        layer["self_attn"].attention = wrapper


def seconds_per_step(step: Callable[[], None], steps: int, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def describe(args: argparse.Namespace, config: Any) -> str:
    cuda = args.device == "cuda"
    return (
        f"device {args.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), torch {torch.__version__}, "
        f"drafter {config.num_hidden_layers} layers hidden {config.hidden_size}, q {args.blocks * 16} "
        f"kv {args.context + args.blocks * 16}, {'forward+backward' if cuda else 'forward'}"
    )
