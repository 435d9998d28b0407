"""What `cache fix` and `cache restore` cost against `cache check` on the same large Triton cache.

    python benchmarks/cache_repair.py --entries 20000 --broken 40 --repeats 3

Generates a Triton cache laid out as triton writes it (tests/cache_tree.py, 7 files per entry) with
`--broken` entries truncated, then, `--repeats` times, runs the three commands as a user does (a new
process each): `check` (the baseline: one scan), `fix` (a scan, then, holding the root's lock, a
second scan and the moves: another fix may have moved entries since the first) and `restore` (no
scan: the manifests, the moves back, a sha256 of every file put back). Prints the median wall time
of each and the ratios to `check`, and checks that the tree is byte-identical after each restore.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import cache_tree


def _timed(root: Path, action: str, reports: Path) -> float:
    command = [sys.executable, "-m", "dflashdoctor", "cache", action, "--triton-dir", str(root)]
    started = time.perf_counter()
    done = subprocess.run([*command, "--report-dir", str(reports / action)], capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    expected = 1 if action == "check" else 0  # check finds the broken entries; fix and restore succeed
    if done.returncode != expected:
        raise SystemExit(f"cache {action} exited {done.returncode}: {done.stderr or done.stdout[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--broken", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-repair-bench-") as tmp:
        root, reports = Path(tmp, "triton"), Path(tmp, "reports")
        folders = cache_tree.healthy_tree(root, args.entries)
        for folder in folders[:: max(1, args.entries // args.broken)][: args.broken]:
            cache_tree.truncate_binary(folder)
        before = cache_tree.snapshot(root)
        times: dict[str, list[float]] = {"check": [], "fix": [], "restore": []}
        for _ in range(args.repeats):
            for action in times:
                times[action].append(_timed(root, action, reports))
            if cache_tree.snapshot(root) != before:
                raise SystemExit("the tree is not byte-identical after fix and restore")
        medians = {action: statistics.median(runs) for action, runs in times.items()}
        for action, runs in times.items():
            print(
                f"{action:8s} median {medians[action]:.2f} s (all: {', '.join(f'{t:.2f}' for t in runs)}); "
                f"{medians[action] / medians['check']:.2f}x check"
            )
        print(f"{args.entries} entries, {args.broken} broken; the tree byte-identical after every restore")


if __name__ == "__main__":
    main()
