"""Wall time of `dflashdoctor check-compile` on the default reference, cold and warm Inductor cache.

Baseline, measured in the same run: a bare script doing the least any such check must do (compile
flex_attention, one forward and, on CUDA, one backward at the same shape and mask), in a fresh
process with the same cache state. The ratio says what the doctor costs on top of that.

    python benchmarks/check_compile.py --device cpu --repeats 3

Cold: every repeat gets a new, empty TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR.
Warm: one untimed run fills a cache directory, then every repeat reuses it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BASELINE = """
import sys, torch
from torch.nn.attention.flex_attention import flex_attention
from dflashdoctor.reference.masks import build_block_mask
from dflashdoctor.shapes import default_shape
device = sys.argv[1]
s = default_shape(device)
dtype = getattr(torch, s.dtype)
grad = device == "cuda"
q = torch.randn(s.batch, s.heads, s.q_len, s.head_dim, device=device, dtype=dtype, requires_grad=grad)
k = torch.randn(s.batch, s.kv_heads, s.kv_len, s.head_dim, device=device, dtype=dtype, requires_grad=grad)
v = torch.randn(s.batch, s.kv_heads, s.kv_len, s.head_dim, device=device, dtype=dtype, requires_grad=grad)
mask = build_block_mask("dflash", s.q_len, s.kv_len, device, s.block_size)
out = torch.compile(flex_attention)(q, k, v, block_mask=mask, enable_gqa=True)
if grad:
    out.sum().backward()
    torch.cuda.synchronize()
"""


def _timed(argv: list[str], cache: Path) -> float:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(cache / "triton"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cache)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"{argv[:4]} failed with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed


def _commands(device: str, report_dir: Path) -> dict[str, list[str]]:
    return {
        "check-compile": [
            sys.executable,
            "-m",
            "dflashdoctor",
            "check-compile",
            "--device",
            device,
            "--json",
            "--report-dir",
            str(report_dir),
        ],
        "baseline": [sys.executable, "-c", BASELINE, device],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-bench-") as tmp:
        work = Path(tmp)
        commands = _commands(args.device, work / "report")
        for name, argv in commands.items():
            warm_cache = work / f"warm-{name}"
            warm_cache.mkdir()
            _timed(argv, warm_cache)  # fills the warm cache, untimed
            for i in range(args.repeats):
                cold_cache = work / f"cold-{name}-{i}"
                cold_cache.mkdir()
                times.setdefault((name, "cold"), []).append(_timed(argv, cold_cache))
                times.setdefault((name, "warm"), []).append(_timed(argv, warm_cache))
    print(f"device {args.device}, {args.repeats} repeats, medians in seconds")
    print(f"{'cache':6} {'check-compile':>14} {'baseline':>9} {'ratio':>6}   all check-compile runs")
    for cache in ("cold", "warm"):
        ours, base = statistics.median(times[("check-compile", cache)]), statistics.median(times[("baseline", cache)])
        runs = ", ".join(f"{t:.1f}" for t in times[("check-compile", cache)])
        print(f"{cache:6} {ours:14.1f} {base:9.1f} {ours / base:6.2f}   {runs}")


if __name__ == "__main__":
    main()
