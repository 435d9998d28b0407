"""init and lint scored on the copies of real repositories (tests/realworld/repos) against the truth
read from their code, and init's time on the largest copy against reading its files (the floor), in
the same run: medians over repeats with their range.

    python3 benchmarks/repo_corpus.py [--repeats 7] [--held-out]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflashdoctor.commands.init import InitOptions, init
from tests.realworld.repo_truth import CORPUS, HELD_OUT, cases, score


def _scores(folder: Path) -> None:
    fields: dict[str, list[bool]] = {}
    calls: dict[str, int] = {}
    for name in cases(folder):
        result = score(name, folder)
        for key, right in result.fields.items():
            fields.setdefault(key, []).append(right)
        for outcome, count in result.calls.items():
            calls[outcome] = calls.get(outcome, 0) + count
        wrong = [key for key, right in result.fields.items() if not right]
        print(f"{name:20s} init wrong: {', '.join(wrong) or '-':30s} lint: {result.calls}")
        for line in result.wrong_calls:
            print(f"    {line}")
    for key, rights in fields.items():
        print(f"init {key:20s} {sum(rights)}/{len(rights)}")
    print(f"lint calls and constructs: {calls} of {sum(calls.values())}")


def _size(repo: Path) -> int:
    return sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())


def _timing(repeats: int) -> None:
    repo = max((CORPUS / name for name in cases()), key=_size)
    floor, runs = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        for path in repo.rglob("*"):
            if path.is_file():
                path.read_bytes()
        floor.append(time.perf_counter() - started)
        started = time.perf_counter()
        init(InitOptions(root=repo))
        runs.append(time.perf_counter() - started)
    base, took = statistics.median(floor), statistics.median(runs)
    files = sum(1 for p in repo.rglob("*") if p.is_file())
    print(f"init on {repo.name} ({files} files, {_size(repo) / 2**10:.0f} KiB), median of {repeats}:")
    print(f"  read every file (floor) {base * 1000:.1f} ms (range {min(floor) * 1000:.1f}-{max(floor) * 1000:.1f})")
    print(
        f"  init                    {took * 1000:.1f} ms (range {min(runs) * 1000:.1f}-{max(runs) * 1000:.1f}),"
        f" {took / base:.1f}x the floor"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--held-out", action="store_true", help="score the held-out copies instead")
    args = parser.parse_args()
    _scores(HELD_OUT if args.held_out else CORPUS)
    if not args.held_out:
        _timing(args.repeats)


if __name__ == "__main__":
    main()
