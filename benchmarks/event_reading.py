"""Reading back a long `run`'s event lines: this version against another, alternated in one run.

`run` reads every process's events as they come, and `merge` reads every node's again
from the files; each line is checked against its type and each snapshot's observations are loaded
strictly. The file is a recorded process's lines
(tests/assets/observations/cpu/run-eager-flex) with its steps, dense kernels and snapshots repeated
to `--lines`; each round times `read_logs` on it in a fresh process per version, medians over rounds.

    python3 benchmarks/event_reading.py --lines 20000 --rounds 5 --baseline DIR
    # DIR: git archive <commit> dflashdoctor probes | tar -x -C DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "assets" / "observations" / "cpu" / "run-eager-flex.events"


def _events(folder: Path, lines: int) -> Path:
    (source,) = RECORDED.glob("*.jsonl")
    records = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    body = [r for r in records if r["kind"] in ("step", "dense", "snapshot")]
    head = [r for r in records if r["kind"] not in ("step", "dense", "snapshot", "exit")]
    tail = [r for r in records if r["kind"] == "exit"]
    repeated = [body[i % len(body)] for i in range(lines - len(head) - len(tail))]
    events = folder / "events"
    events.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in [*head, *repeated, *tail])
    (events / source.name).write_text(text, encoding="utf-8")
    return events


def _time_here(events: Path) -> None:
    """In the child: one read of the whole folder, its seconds and what it kept, as JSON."""
    from dflashdoctor.runs.events import read_logs

    started = time.perf_counter()
    logs = read_logs(events)
    seconds = time.perf_counter() - started
    print(json.dumps({"s": seconds, "damaged": sum(log.damaged_lines for log in logs)}))


def _timed(events: Path, package_root: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(package_root))
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(events)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another version's folder (dflashdoctor/ inside)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _time_here(args.child)
        return
    versions = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    with tempfile.TemporaryDirectory(prefix="event-reading-") as tmp:
        events = _events(Path(tmp), args.lines)
        times: dict[str, list[float]] = {name: [] for name in versions}
        for round_ in range(args.rounds):
            order = list(versions) if round_ % 2 == 0 else list(reversed(versions))
            for name in order:
                result = _timed(events, versions[name])
                assert result["damaged"] == 0, (name, result)
                times[name].append(result["s"])
    print(f"{args.lines} event lines, {args.rounds} rounds, a fresh process per read")
    for name, samples in times.items():
        print(f"  {name:9} median {statistics.median(samples):7.3f} s   " + ", ".join(f"{s:.3f}" for s in samples))
    if "baseline" in times:
        ratio = statistics.median(times["this"]) / statistics.median(times["baseline"])
        print(f"  ratio this / baseline: {ratio:.3f}")


if __name__ == "__main__":
    main()
