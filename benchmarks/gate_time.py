"""Wall time of `dflashdoctor gate` on the embedded default: cold and warm, probes at once.

Baselines, measured in the same run: the same gate with `parallel = false` (the probes one after
another, warm cache); the floor any probe pays, a fresh interpreter importing torch (and, on a
GPU machine, initialising CUDA); and the compile floor, a fresh interpreter that compiles
flex_attention once at check-compile's default shape and mask from the same warm cache and calls
it (the least any check that proves a compile in a fresh process costs). The ratios say what
running the probes at once buys and how far above each floor the gate is.

    python3 benchmarks/gate_time.py --repeats 3 [--keep DIR] [--package DIR] [--no-sequential]

Cold: every repeat gets new, empty TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR; the warm runs
then reuse what that cold run wrote. `--keep DIR` keeps the report folders of the last repeat;
`--package DIR` times the dflashdoctor found there (another version, for a before-and-after in one
run); `--no-sequential` leaves out the one-after-another baseline. The last warm run's sections
are printed with their times: the slowest is the gate's critical path.
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
PACKAGE = ROOT  # the folder whose dflashdoctor is timed (--package)
FLOOR = "import torch\nif torch.cuda.is_available():\n    torch.zeros(1, device='cuda')\n"
# os._exit: the gate's probes end so too (forked ones), without tearing down torch and Inductor.
COMPILE_FLOOR = """import os
import torch
from torch.nn.attention.flex_attention import flex_attention
from dflashdoctor.reference.masks import build_block_mask
from dflashdoctor.shapes import default_shape
device = "cuda" if torch.cuda.is_available() else "cpu"
s = default_shape(device)
dtype = getattr(torch, s.dtype)
q = torch.randn(s.batch, s.heads, s.q_len, s.head_dim, device=device, dtype=dtype)
k, v = (torch.randn(s.batch, s.kv_heads, s.kv_len, s.head_dim, device=device, dtype=dtype) for _ in "kv")
mask = build_block_mask("dflash", s.q_len, s.kv_len, device, s.block_size)
torch.compile(flex_attention)(q, k, v, block_mask=mask, enable_gqa=s.heads != s.kv_heads)
os._exit(0)
"""


def _timed(argv: list[str], cache: Path, cwd: Path) -> float:
    """Seconds; a gate that fails is still timed (its report is kept), and its exit is printed."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE), env.get("PYTHONPATH")]))
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
    parser.add_argument("--package", type=Path, default=ROOT, help="time the dflashdoctor of this folder")
    parser.add_argument("--no-sequential", action="store_true", help="leave out the one-after-another baseline")
    args = parser.parse_args()
    global PACKAGE
    PACKAGE = args.package.resolve()
    print(f"dflashdoctor from {PACKAGE}")
    runs: dict[str, list[float]] = {
        "cold": [],
        "warm": [],
        "warm, one after another": [],
        "floor": [],
        "compile floor": [],
    }
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-gate-bench-") as tmp:
        work = Path(tmp)
        sequential = work / "sequential.toml"
        sequential.write_text("parallel = false\n")
        try:
            for repeat in range(args.repeats):
                cache = work / f"cache-{repeat}"
                runs["cold"].append(_gate(work, cache, work / "cold", None))
                for _ in range(2):  # two warm samples a repeat: the spread of warm runs is the noise
                    runs["warm"].append(_gate(work, cache, work / "warm", None))
                if not args.no_sequential:
                    runs["warm, one after another"].append(_gate(work, cache, work / "sequential", sequential))
                runs["floor"].append(_timed([sys.executable, "-c", FLOOR], cache, work))
                runs["compile floor"].append(_timed([sys.executable, "-c", COMPILE_FLOOR], cache, work))
                done = ", ".join(f"{k} {v[-1]:.1f} s" for k, v in runs.items() if v)
                print(f"repeat {repeat}: {done}", flush=True)
        finally:
            for name in ("cold", "warm", "sequential"):
                if args.keep and (work / name).is_dir():
                    shutil.copytree(work / name, args.keep / f"gate-{name}", dirs_exist_ok=True)
            _sections(work / "warm" / "report.json")
    medians = {k: statistics.median(v) for k, v in runs.items() if v}
    for name, median in medians.items():
        print(f"{name:>24}: median {median:6.1f} s   runs {', '.join(f'{t:.1f}' for t in runs[name])}")
    if "warm, one after another" in medians:
        print(f"warm at once / one after another: {medians['warm'] / medians['warm, one after another']:.2f}")
    print(f"warm / floor (one interpreter importing torch): {medians['warm'] / medians['floor']:.2f}")
    print(f"cold / floor: {medians['cold'] / medians['floor']:.2f}")
    compiled = medians["warm"] / medians["compile floor"]
    print(f"warm / compile floor (one interpreter compiling flex_attention once): {compiled:.2f}")
    print(f"compile floor / floor: {medians['compile floor'] / medians['floor']:.2f}")


def _sections(report: Path) -> None:
    """Each section's time in the last warm gate, and check-compile's phases."""
    import json

    try:
        results = json.loads(report.read_text())["results"]
    except (OSError, ValueError, KeyError):
        return
    print("last warm gate: " + ", ".join(f"{r['probe']} {r.get('duration_s', 0):.1f} s" for r in results))
    for result in results:
        phases = result.get("measurements", {}).get("phase_wall_s")
        if phases:
            print(f"  {result['probe']} phases: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items() if v >= 0.1))


if __name__ == "__main__":
    main()
