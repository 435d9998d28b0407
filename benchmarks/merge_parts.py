"""`merge` of a run on many nodes: the wall time to merge N node parts, against N/8 in the same run.

Each part is a copy of a real node's part of a two-node torchrun (gloo) run kept in
tests/assets/observations/cpu/run-two-nodes (node.json, observations.json, report.json and the
ranks' event logs), renumbered as node k of N. `merge` reads every part as a file another node
placed (placed_files.py) and judges the run across nodes; the merged report is rendered as JSON and
JUnit as the command writes them. Medians over `--repeats`.

    python3 benchmarks/merge_parts.py --parts 600
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dflashdoctor.commands.merge import merge
from dflashdoctor.render.junit import render_junit

PART = (
    Path(__file__).resolve().parent.parent / "tests" / "assets" / "observations" / "cpu" / "run-two-nodes" / "node1-vm"
)


def _shared(folder: Path, parts: int) -> Path:
    shared = folder / f"shared-{parts}"
    record = json.loads((PART / "node.json").read_text())
    for rank in range(parts):
        part = shared / f"node{rank}-host{rank}"
        shutil.copytree(PART, part)
        (part / "node.json").write_text(
            json.dumps(record | {"nnodes": parts, "node_rank": rank, "host": f"host{rank}"})
        )
    return shared


def _timed(shared: Path, repeats: int) -> tuple[float, int]:
    times, findings = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        report = merge(shared, ["dflashdoctor", "merge", str(shared)])
        report.to_json()
        render_junit(report)
        times.append(time.perf_counter() - started)
        findings = sum(len(r.findings) for r in report.results)
    return statistics.median(times), findings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="merge-parts-") as tmp:
        small = _timed(_shared(Path(tmp), args.parts // 8), args.repeats)
        large = _timed(_shared(Path(tmp), args.parts), args.repeats)
    print(f"{args.parts // 8} parts: {small[0]:.2f} s ({small[1]} findings)")
    print(f"{args.parts} parts: {large[0]:.2f} s ({large[1]} findings): {large[0] / small[0]:.1f}x the time for 8x")


if __name__ == "__main__":
    main()
