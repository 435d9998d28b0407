"""How long `dflashdoctor init` takes on 10,000 realistic Python files (issue 31 asks for under a
second): the installed transformers package's .py files copied, tree and all, into a temporary
folder as many times as it takes (`copy_00/`, `copy_01/`, ...; the last copy partial) to reach
`--files`. Measured in process (the scan and the table, what the command does after its imports)
and as the CLI a user runs (`python3 -m dflashdoctor init ROOT`, interpreter start and imports
included), against the floor measured in the same run: reading every .py of the tree once.
Medians over repeats; the printed table's hash shows every repeat printed the same.

    python3 benchmarks/init_time.py [--files 10000] [--repeats 5] [--source PATH] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dflashdoctor.commands.init import InitOptions, init
from dflashdoctor.commands.lint import python_files


def _sources(source: Path) -> list[Path]:
    return [path.relative_to(source) for path in python_files([source])]


def build_tree(source: Path, root: Path, files: int) -> int:
    """Copy `source`'s .py files under `root` until there are `files` of them; returns the bytes."""
    relatives, written, size = _sources(source), 0, 0
    while written < files:
        copy = root / f"copy_{written // len(relatives):02d}"
        for relative in relatives[: files - written]:
            target = copy / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / relative, target)
            size += target.stat().st_size
        written += min(len(relatives), files - written)
    return size


def _floor(root: Path) -> float:
    started = time.perf_counter()
    for path in python_files([root]):
        path.read_bytes()
    return time.perf_counter() - started


def _in_process(root: Path) -> tuple[float, str]:
    started = time.perf_counter()
    text = init(InitOptions(root=root))
    return time.perf_counter() - started, hashlib.sha256(text.encode()).hexdigest()[:12]


def _cli(root: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dflashdoctor", "init", str(root)], check=True, capture_output=True)
    return time.perf_counter() - started


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s (samples {', '.join(f'{v:.3f}' for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--source", type=Path, help="a tree of .py files to replicate (default: transformers)")
    parser.add_argument("--keep", type=Path, help="build the tree here and keep it (default: a temporary folder)")
    args = parser.parse_args()
    if args.source is None:
        import transformers

        args.source = Path(os.path.dirname(transformers.__file__))
    root = args.keep or Path(tempfile.mkdtemp(prefix="dflashdoctor-init-time-"))
    try:
        size = build_tree(args.source, root, args.files)
        print(f"{root}: {args.files} files copied from {args.source}, {size / 2**20:.1f} MiB")
        _in_process(root)  # one pass first, so that every repeat finds the files in the page cache
        floors, scans, clis, hashes = [], [], [], set()
        for _ in range(args.repeats):
            floors.append(_floor(root))
            seconds, digest = _in_process(root)
            scans.append(seconds)
            hashes.add(digest)
            clis.append(_cli(root))
        print(f"read every file (floor): {_median(floors)}")
        print(f"init, in process:        {_median(scans)}; printed table sha256 {', '.join(sorted(hashes))}")
        print(f"init, the CLI:           {_median(clis)}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
