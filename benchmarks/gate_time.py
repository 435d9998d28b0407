"""Wall time of `dflashdoctor gate` on the embedded default: cold and warm, probes at once.

Baselines, measured in the same run: the same gate with `parallel = false` (the probes one after
another, warm cache), and the floor any probe pays, a fresh interpreter importing torch (and, on a
GPU machine, initialising CUDA). The issue's targets are absolute (H200: 60 s cold, 20 s warm; CPU:
120 s); the ratios say what running the probes at once buys and how far above the floor it is.

    python3 benchmarks/gate_time.py --repeats 3 [--keep DIR]

Cold: every repeat gets new, empty TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR; the warm runs
then reuse what that cold run wrote. `--keep DIR` keeps the report folders of the last repeat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = "import torch\nif torch.cuda.is_available():\n    torch.zeros(1, device='cuda')\n"


def _timed(argv: list[str], cache: Path, cwd: Path) -> float:
    """Seconds; a gate that fails is still timed (its report is kept), and its exit is printed."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"{' '.join(argv[2:4])} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-1000:]}")
    return elapsed


def _gate(work: Path, cache: Path, report: Path, config: Path | None) -> float:
    argv = [sys.executable, "-m", "dflashdoctor", "gate", "--report-dir", str(report)]
    return _timed(argv + (["--config", str(config)] if config else []), cache, work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="copy the last repeat's report folders here")
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"cold": [], "warm": [], "warm, one after another": [], "floor": []}
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-gate-bench-") as tmp:
        work = Path(tmp)
        sequential = work / "sequential.toml"
        sequential.write_text("parallel = false\n")
        try:
            for repeat in range(args.repeats):
                cache = work / f"cache-{repeat}"
                runs["cold"].append(_gate(work, cache, work / "cold", None))
                runs["warm"].append(_gate(work, cache, work / "warm", None))
                runs["warm, one after another"].append(_gate(work, cache, work / "sequential", sequential))
                runs["floor"].append(_timed([sys.executable, "-c", FLOOR], cache, work))
                print(f"repeat {repeat}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in runs.items()), flush=True)
        finally:
            for name in ("cold", "warm", "sequential"):
                if args.keep and (work / name).is_dir():
                    shutil.copytree(work / name, args.keep / f"gate-{name}", dirs_exist_ok=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    for name, median in medians.items():
        print(f"{name:>24}: median {median:6.1f} s   runs {', '.join(f'{t:.1f}' for t in runs[name])}")
    print(f"warm at once / one after another: {medians['warm'] / medians['warm, one after another']:.2f}")
    print(f"warm / floor (one interpreter importing torch): {medians['warm'] / medians['floor']:.2f}")


if __name__ == "__main__":
    main()
