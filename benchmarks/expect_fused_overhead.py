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
from drafter_bench import abba, describe, drafter_options, drafter_step, print_ratio, seconds_per_step, use
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

    times = abba(
        lambda mode: _per_step(step, args.steps, args.device, checked=mode == "checked"), "checked", args.repeats
    )
    empty = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(1000):
            with expect_fused():
                pass
        empty.append((time.perf_counter() - started) / 1000)

    print(describe(args, config))
    print(f"{args.repeats} repeats x 2 samples x {args.steps} steps per mode; one expect_fused() block per step")
    print(f"an empty expect_fused() block: {statistics.median(empty) * 1e6:.1f} us (median of 5 x 1000)")
    print_ratio(times, "checked", "checked")


if __name__ == "__main__":
    main()
