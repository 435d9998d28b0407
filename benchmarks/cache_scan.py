"""Speed and memory of `cache check` on a large Triton cache.

    python benchmarks/cache_scan.py --entries 20000 --repeats 3

Generates a Triton cache laid out as triton writes it (tests/cache_tree.py: per kernel four IR text
files, a cubin-like ELF, metadata and the group file, so 7 files per entry; 20,000 entries are about
140,000 files), then scans it `--repeats` times and prints the median time, entries per second, and
the scan's peak Python memory (tracemalloc) at a quarter of the entries and at all of them: flat
memory means the two peaks are about the same. The first repeat runs on a cold page cache only if
the machine has just dropped it; the median is over warm scans.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflashdoctor.cache.triton_scan import scan_triton
from tests import cache_tree


def _scan(root: Path) -> tuple[float, int, int]:
    started = time.perf_counter()
    scan = scan_triton(root, "benchmark", cache_tree.INSTALLED)
    elapsed = time.perf_counter() - started
    assert not scan.problems, scan.problems[:3]
    return elapsed, scan.entries, scan.files


def _peak(root: Path) -> int:
    tracemalloc.start()
    scan_triton(root, "benchmark", cache_tree.INSTALLED)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-cache-bench-") as tmp:
        quarter, full = Path(tmp, "quarter"), Path(tmp, "full")
        started = time.perf_counter()
        cache_tree.healthy_tree(quarter, args.entries // 4)
        cache_tree.healthy_tree(full, args.entries)
        print(f"generated {args.entries} + {args.entries // 4} entries in {time.perf_counter() - started:.1f} s")
        times, entries, files = [], 0, 0
        for _ in range(args.repeats):
            elapsed, entries, files = _scan(full)
            times.append(elapsed)
        median = statistics.median(times)
        print(
            f"scan: {entries} entries, {files} files; median {median:.2f} s over {args.repeats} "
            f"(all: {', '.join(f'{t:.2f}' for t in times)}); {entries / median:,.0f} entries/s"
        )
        small, large = _peak(quarter), _peak(full)
        print(
            f"peak Python memory while scanning: {small / 2**20:.2f} MiB at {args.entries // 4} entries, "
            f"{large / 2**20:.2f} MiB at {args.entries}"
        )


if __name__ == "__main__":
    main()
