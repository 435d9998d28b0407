"""The scoreboard: trace-attention on every case of the real-code corpus (tests/realworld/corpus.py),
each dimension scored against the case's truth, then the share right per dimension.

    python3 benchmarks/accuracy.py [--device cuda] [--only NAME,...] [--json FILE]

On the CPU every case runs forward only (flex_attention has no CPU backward); `--device cuda` runs
the cases that have GPU arguments, forward and backward, and keeps each report under --reports.
Not a timing: each case is one child process, and the table says how long each took.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.realworld.corpus import CASES, DIMENSIONS, HERE, Case, score  # noqa: E402


def _run(case: Case, args: tuple[str, ...], reports: Path) -> tuple[int, dict[str, Any] | None, float]:
    folder = reports / case.id
    command = [sys.executable, "-m", "dflashdoctor", "trace-attention", "--script", str(HERE / case.script)]
    command += ["--report-dir", str(folder), "--", *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE, timeout=1200)
    took = time.perf_counter() - start
    try:
        return done.returncode, json.loads((folder / "report.json").read_text()), took
    except (OSError, ValueError):
        return done.returncode, None, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", default="", help="comma-separated parts of case ids")
    parser.add_argument("--reports", type=Path, help="keep each case's report folder here")
    parser.add_argument("--json", type=Path, help="write the scores as JSON here")
    options = parser.parse_args(argv)
    chosen = [c for c in CASES if not options.only or any(part in c.id for part in options.only.split(","))]
    if options.device == "cuda":
        chosen = [c for c in chosen if c.gpu_args is not None]
    else:
        chosen = [c for c in chosen if not c.notes.get("gpu_only")]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        return _score(chosen, options, options.reports or Path(scratch), rows)


def _score(chosen: list[Case], options: argparse.Namespace, reports: Path, rows: list[dict[str, Any]]) -> int:
    print(f"| case | source | {' | '.join(DIMENSIONS)} | seconds |")
    print("|---|---|" + "---|" * len(DIMENSIONS) + "---|")
    for case in chosen:
        args = case.gpu_args if options.device == "cuda" and case.gpu_args is not None else case.args
        code, report, took = _run(case, args, reports)
        scored = score(case, code, report)
        rows.append({"case": case.id, "source": case.source, "exit": code, **scored, "seconds": round(took, 1)})
        marks = " | ".join("right" if scored[d] else "WRONG" for d in DIMENSIONS)
        print(f"| {case.id} | {case.source.split(' (')[0]} | {marks} | {took:.1f} |", flush=True)
    sources = {c.source.split(" (")[0].split("==")[0].split("@")[0] for c in chosen}
    print(f"\n{len(rows)} cases from {len(sources)} sources ({options.device}):")
    for dimension in DIMENSIONS:
        right = sum(r[dimension] for r in rows)
        print(f"- {dimension}: {right}/{len(rows)} right")
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(all(r[d] for d in DIMENSIONS) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
