"""`explain` on a large log against the floor of reading it, in the same run, with the peak memory:
a generated training log of SIZE MiB (ranks interleaved, a traceback near the end, 1 GiB by
default), medians over repeats with their range.

    python3 benchmarks/explain_time.py [--mib 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflashdoctor.commands.explain import ExplainOptions, explain

_STEP = b"[rank%d]: step %d loss 2.4100 lr 3.0e-04 grad_norm 1.03 tokens/s 51234\n"
_FAILURE = (
    b"[rank3]: Traceback (most recent call last):\n"
    b'[rank3]:   File "/work/train.py", line 88, in step\n'
    b'[rank3]:   File "/usr/lib/python3.11/site-packages/triton/runtime/autotuner.py", line 171, in run\n'
    b"[rank3]: TypeError: 'NoneType' object is not a mapping (self.nargs)\n"
)


def _log(path: Path, mib: int) -> None:
    block = b"".join(_STEP % (i % 8, i) for i in range(20_000))
    with open(path, "wb") as handle:
        written = 0
        while written < mib << 20:
            handle.write(block)
            written += len(block)
        handle.write(_FAILURE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "train.log"
        _log(log, args.mib)
        size = log.stat().st_size
        floor, runs = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            with open(log, "rb") as handle:
                while handle.read(1 << 20):
                    pass
            floor.append(time.perf_counter() - started)
            started = time.perf_counter()
            report = explain(ExplainOptions(logs=[str(log)]), ["explain"])
            runs.append(time.perf_counter() - started)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        found = [f.code for f in report.results[0].findings]
        base, took = statistics.median(floor), statistics.median(runs)
        print(f"log: {size / 2**20:.0f} MiB, {report.results[0].measurements['lines']} lines; found {found}")
        print(f"read it (floor): {base:.2f} s (range {min(floor):.2f}-{max(floor):.2f})")
        print(
            f"explain:         {took:.2f} s (range {min(runs):.2f}-{max(runs):.2f}), {took / base:.1f}x the floor, "
            f"{size / 2**20 / took:.0f} MiB/s"
        )
        print(f"peak memory of this process: {peak:.0f} MiB (pid {os.getpid()})")


if __name__ == "__main__":
    main()
