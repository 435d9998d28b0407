"""What recording a call of transformers' compiled flex singleton costs, per call, in one process.

A model whose layers call `compile_friendly_flex_attention` themselves (SpecForge's DFlash drafter)
has each call recorded by the flex-call recorder's wrapper around transformers' singleton. Here the
singleton is compiled while the recorder is active, and samples alternate (ABBA) between calling
through the recording wrapper and calling the compiled function it wraps, from a module's forward
as a drafter layer does, at a small shape where the recorder's share is largest.

    python3 benchmarks/singleton_call_cost.py [--repeats 20] [--calls 200] [--q 64] [--kv 192]

Prints per-call medians (us) of both, their ratio with a bootstrap 95% interval, and the difference.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import transformers.integrations.flex_attention as hf_flex
from torch.nn.attention.flex_attention import create_block_mask

from dflashdoctor.hooks.flex_calls import FlexCallRecorder
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.module_names import ModuleNamer


class _Layer(torch.nn.Module):
    """Calls the singleton the way a drafter layer calls compile_friendly_flex_attention."""

    def __init__(self, flex, q, k, v, mask) -> None:
        super().__init__()
        self.flex, self.inputs, self.mask = flex, (q, k, v), mask

    def forward(self) -> torch.Tensor:
        return self.flex(*self.inputs, block_mask=self.mask, enable_gqa=True)


def _per_call_us(layer: _Layer, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        layer()
    return (time.perf_counter() - started) / calls * 1e6


def _interval(plain: list[float], recorded: list[float]) -> tuple[float, float]:
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(recorded, k=len(recorded))) / statistics.median(rng.choices(plain, k=len(plain)))
        for _ in range(2000)
    )
    return ratios[50], ratios[1949]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--q", type=int, default=64)
    parser.add_argument("--kv", type=int, default=192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    q = torch.randn(1, 4, args.q, 16)
    k, v = torch.randn(1, 2, args.kv, 16), torch.randn(1, 2, args.kv, 16)
    mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + args.kv - args.q, 1, 1, args.q, args.kv)
    with DenseFlexRecorder() as dense, FlexCallRecorder(dense, ModuleNamer()) as recorder, torch.no_grad():
        hf_flex.WrappedFlexAttention._instance = None  # compiled now, while recording, as under run
        hf_flex.WrappedFlexAttention._is_flex_compiled = False
        recording = hf_flex.WrappedFlexAttention(False)()
        recorded_layer = _Layer(recording, q, k, v, mask)
        plain_layer = _Layer(recording.__wrapped__, q, k, v, mask)
        for layer in (plain_layer, recorded_layer):
            _per_call_us(layer, args.calls)  # compile and warm
        plain, recorded = [], []
        for _ in range(args.repeats):
            plain.append(_per_call_us(plain_layer, args.calls))
            recorded.append(_per_call_us(recorded_layer, args.calls))
            recorded.append(_per_call_us(recorded_layer, args.calls))
            plain.append(_per_call_us(plain_layer, args.calls))
        calls = sum(site.calls for site in recorder.sites.values())
    assert calls == args.calls * (2 * args.repeats + 1), calls  # the recorder saw each recorded call
    low, high = _interval(plain, recorded)
    p, r = statistics.median(plain), statistics.median(recorded)
    print(f"torch {torch.__version__}, q {args.q} kv {args.kv}, {args.repeats} ABBA repeats of {args.calls} calls")
    print(f"plain    : {p:.1f} us per call")
    print(f"recorded : {r:.1f} us per call")
    print(f"ratio    : {r / p:.3f} (95% {low:.3f} to {high:.3f}); added {r - p:.1f} us per call")


if __name__ == "__main__":
    main()
