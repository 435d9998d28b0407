"""Rendering a gate report of many nodes: JUnit XML and the terminal, for N unreachable hosts.

The nodes section is the real judge's (`judges.nodes.judge`) over N node outcomes with no report,
as a gate whose hosts `ssh` could not reach writes it. Each renderer runs `--repeats` times; the
median wall time and the output's size are printed, with N/8 nodes as the baseline in the same run.

    python3 benchmarks/many_nodes_render.py --nodes 1024
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

from rich.console import Console

from dflashdoctor.judges.nodes import NodeOutcome, judge
from dflashdoctor.render.junit import render_junit
from dflashdoctor.render.terminal import render_terminal
from dflashdoctor.report import Report


def _report(nodes: int) -> Report:
    outcomes = [NodeOutcome(f"node{i:04d}", error="ssh: connect to host: Connection refused") for i in range(nodes)]
    report = Report(command="gate", argv=["dflashdoctor", "gate"], started="now", results=[judge(outcomes)])
    report.settle_verdict()
    return report


def _terminal(report: Report) -> str:
    buffer = io.StringIO()
    render_terminal(report, Console(file=buffer, width=100, force_terminal=False), verbose=False, report_dir="r")
    return buffer.getvalue()


def _timed(render, report: Report, repeats: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        size = len(render(report))
        times.append(time.perf_counter() - started)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name, render in (("junit", render_junit), ("terminal", _terminal)):
        base_s, base_size = _timed(render, _report(args.nodes // 8), args.repeats)
        wall_s, size = _timed(render, _report(args.nodes), args.repeats)
        print(
            f"{name:>8}: {args.nodes // 8} nodes {base_s:.3f} s ({base_size / 1024:.0f} KiB), "
            f"{args.nodes} nodes {wall_s:.3f} s ({size / 1024:.0f} KiB): {wall_s / base_s:.1f}x the time "
            "for 8x the nodes"
        )


if __name__ == "__main__":
    main()
