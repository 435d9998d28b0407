"""The workload of `dense_call_cost.py`: a model whose every layer calls flex_attention raw.

    python3 benchmarks/dense_layers.py [--layers 15] [--forwards 10] [--times-to FILE]

Each layer projects its input and calls `flex_attention` as imported at the top of this file, with
no torch.compile anywhere, so on the CPU every call runs the dense kernel: `--layers` x
`--forwards` dense calls in the timed part. One forward first, untimed, pays what every first call
pays once (torch compiles flex_attention's eager wrapper for itself). It imports torch only, so
the same file runs plain, as `dflashdoctor trace-attention --script` and under `dflashdoctor run`,
and the process's wall time is comparable across the three. The time of the timed forwards, taken
inside the script and so free of the doctor's own start-up, is printed and, with `--times-to`,
appended to that file as one JSON line (trace-attention keeps a script's output to itself).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention

Attention = Callable[..., torch.Tensor]


class Layer(torch.nn.Module):
    def __init__(self, dim: int, heads: int, attention: Attention) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.attention = attention  # an attribute, so the in-process benchmark can swap it per mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        return x + self.attention(q, k, v).transpose(1, 2).reshape(batch, seq, dim)


class DenseLayers(torch.nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, attention: Attention = flex_attention) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(dim, heads, attention) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The model's and the input's size, shared with the benchmark that drives this file."""
    parser.add_argument("--layers", type=int, default=15)
    parser.add_argument("--forwards", type=int, default=10, help="timed forwards, after one untimed")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's threads: with more, on a shared machine, a thread waits for one whose core another "
        "process took, and samples spread several times over",
    )
    return parser


def build(args: argparse.Namespace) -> tuple[DenseLayers, torch.Tensor]:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    return DenseLayers(args.layers, args.dim, args.heads), torch.randn(1, args.seq, args.dim)


def main() -> None:
    parser = options(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--times-to", help="append the timing to this file as one JSON line")
    args = parser.parse_args()
    model, x = build(args)
    with torch.no_grad():  # flex_attention has no backward on the CPU
        model(x)
        started = time.perf_counter()
        for _ in range(args.forwards):
            model(x)
        seconds = time.perf_counter() - started
    record = {"forwards_s": seconds, "dense_calls": args.layers * args.forwards}
    print(json.dumps(record))
    if args.times_to:
        with open(args.times_to, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
