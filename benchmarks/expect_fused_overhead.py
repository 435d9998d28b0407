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

import statistics
import time
from collections.abc import Callable

import torch
from drafter_bench import describe, drafter_options, drafter_step, ratio_interval, seconds_per_step, use
from torch.nn.attention.flex_attention import flex_attention

from dflashdoctor.testing import expect_fused, record


def _per_step(step: Callable[[], None], steps: int, device: str, checked: bool) -> float:
    if not checked:
        return seconds_per_step(step, steps, device)

    def checked_step() -> None:
        with expect_fused():
            step()

    return seconds_per_step(checked_step, steps, device)


def main() -> None:
    args = drafter_options(__doc__.splitlines()[0])
    config, drafter, step = drafter_step(args)
    use(drafter, torch.compile(flex_attention))
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
    low, high = ratio_interval(times["plain"], times["checked"])
    print(describe(args, config))
    print(f"{args.repeats} repeats x 2 samples x {args.steps} steps per mode; one expect_fused() block per step")
    print(f"{'plain ms/step':>14} {'checked ms/step':>16} {'ratio':>6} {'95% interval':>16}")
    print(f"{plain_ms:14.3f} {checked_ms:16.3f} {checked_ms / plain_ms:6.3f}   [{low:.3f}, {high:.3f}]")
    print(f"an empty expect_fused() block: {statistics.median(empty) * 1e6:.1f} us (median of 5 x 1000)")
    for name in ("plain", "checked"):
        print(f"  {name}: " + ", ".join(f"{t * 1e3:.3f}" for t in times[name]))


if __name__ == "__main__":
    main()
