"""How long `dflashdoctor lint` and `dflashdoctor init` take on a large real source tree (the
installed transformers package by default), against the floor measured in the same run: reading
every .py file of the tree once (what any scan pays). In process, medians over repeats.

    python3 benchmarks/lint_time.py [--repeats 5] [PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from dflashdoctor.commands.init import InitOptions, init
from dflashdoctor.commands.lint import LintOptions, lint, python_files


def _read_all(root: Path) -> int:
    total = 0
    for path in python_files([root]):
        total += len(path.read_bytes())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("path", nargs="?")
    args = parser.parse_args()
    if args.path is None:
        import transformers

        root = Path(os.path.dirname(transformers.__file__))
    else:
        root = Path(args.path)
    floor, scans, inits = [], [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        size = _read_all(root)
        floor.append(time.perf_counter() - started)
        started = time.perf_counter()
        report = lint(LintOptions([root]), ["lint"])
        scans.append(time.perf_counter() - started)
        started = time.perf_counter()
        init(InitOptions(root=root))
        inits.append(time.perf_counter() - started)
    result = report.results[0]
    print(f"{root}: {result.measurements['files']} files, {size / 2**20:.1f} MiB, {len(result.findings)} findings")
    print(f"read every file (floor): {statistics.median(floor):.3f} s (median of {args.repeats})")
    scan, base = statistics.median(scans), statistics.median(floor)
    print(f"lint:                    {scan:.3f} s ({scan / base:.2f}x the floor)")
    inferred = statistics.median(inits)
    print(f"init:                    {inferred:.3f} s ({inferred / base:.2f}x the floor)")


if __name__ == "__main__":
    main()
