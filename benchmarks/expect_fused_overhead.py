"""What `dflashdoctor.testing.expect_fused()` costs a compiled DFlash drafter training step.

    python benchmarks/expect_fused_overhead.py --device cuda
    python benchmarks/expect_fused_overhead.py --device cpu --repeats 3   # forward only, tiny scale

The reference drafter (the qwen27b-dflash preset: full scale on CUDA, tiny on CPU) whose layers
call a `torch.compile(flex_attention)` wrapper, compiled and warmed first; one step is forward and,
on CUDA, backward. Plain: the step alone. Checked: each step inside its own `with expect_fused():`
block, as a test writes it, so every step pays the block's entry and exit (installing the dense
hook, reading dynamo's records, judging). Each repeat times `--steps` steps per sample in the
order plain, checked, checked, plain; the figures are medians over all samples, the ratio
checked/plain, and a 95% bootstrap interval of that ratio (resampling the samples of each mode).
The cost of one empty block is timed on its own as well.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention

from dflashdoctor.models import build_config
from dflashdoctor.reference.drafter_step import make_drafter_step
from dflashdoctor.testing import expect_fused, record


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _per_step(step: Callable[[], None], steps: int, device: str, checked: bool) -> float:
    _sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        if checked:
            with expect_fused():
                step()
        else:
            step()
    _sync(device)
    return (time.perf_counter() - started) / steps


def _bootstrap(plain: list[float], checked: list[float], rounds: int = 2000) -> tuple[float, float]:
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(checked, k=len(checked))) / statistics.median(rng.choices(plain, k=len(plain)))
        for _ in range(rounds)
    )
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50, help="steps per timed sample")
    parser.add_argument("--context", type=int, default=4096, help="context tokens before the draft blocks")
    parser.add_argument("--blocks", type=int, default=16, help="draft blocks of 16 tokens")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    config = build_config("qwen27b-dflash", "full" if cuda else "tiny")
    dtype = torch.bfloat16 if cuda else torch.float32
    drafter, step = make_drafter_step(
        config, args.device, dtype, None, backward=cuda, blocks=args.blocks, context_len=args.context
    )
    compiled = torch.compile(flex_attention)
    for layer in drafter.layers:
        layer["self_attn"].attention = compiled
    with record() as warm:
        for _ in range(3):
            step()
    if warm.dense_events:
        raise SystemExit(f"the benchmark step ran {len(warm.dense_events)} dense flex kernels: not a fused step")

    times: dict[str, list[float]] = {"plain": [], "checked": []}
    for _ in range(args.repeats):
        for mode in ("plain", "checked", "checked", "plain"):  # ABBA: drift hits both modes alike
            times[mode].append(_per_step(step, args.steps, args.device, checked=mode == "checked"))
    empty = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(1000):
            with expect_fused():
                pass
        empty.append((time.perf_counter() - started) / 1000)

    plain_ms, checked_ms = (statistics.median(times[k]) * 1e3 for k in ("plain", "checked"))
    low, high = _bootstrap(times["plain"], times["checked"])
    print(
        f"device {args.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), torch {torch.__version__}, "
        f"drafter {config.num_hidden_layers} layers hidden {config.hidden_size}, q {args.blocks * 16} "
        f"kv {args.context + args.blocks * 16}, {'forward+backward' if cuda else 'forward'}"
    )
    print(f"{args.repeats} repeats x 2 samples x {args.steps} steps per mode; one expect_fused() block per step")
    print(f"{'plain ms/step':>14} {'checked ms/step':>16} {'ratio':>6} {'95% interval':>16}")
    print(f"{plain_ms:14.3f} {checked_ms:16.3f} {checked_ms / plain_ms:6.3f}   [{low:.3f}, {high:.3f}]")
    print(f"an empty expect_fused() block: {statistics.median(empty) * 1e6:.1f} us (median of 5 x 1000)")
    for name in ("plain", "checked"):
        print(f"  {name}: " + ", ".join(f"{t * 1e3:.3f}" for t in times[name]))


if __name__ == "__main__":
    main()
