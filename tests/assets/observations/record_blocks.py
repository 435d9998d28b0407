"""Records what `dflashdoctor.testing` sees of real blocks, for the unit tests of its judge: each case
runs in a child process of its own (so dynamo starts clean) and writes `<machine>/block-<case>.json`.

    python3 tests/assets/observations/record_blocks.py cpu [CASE ...]
    python3 tests/assets/observations/record_blocks.py h200 [CASE ...]     # on a CUDA machine

Each case builds real code (the reference drafter and its planted faults, flex_attention called raw,
a score_mod that reads a changing global, a triton autotuner entered by two threads) and records one
block with `dflashdoctor.testing.record()`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
OFFSET = 0  # read by `_shifted`: every new value is a new graph, until the recompile limit


def _shifted(score, b, h, q_idx, kv_idx):
    return score + OFFSET


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _drafter(fault: str | None) -> Callable[[], None]:
    import torch

    from dflashdoctor.models import build_config
    from dflashdoctor.reference.drafter_step import make_drafter_step

    cuda = _device() == "cuda"
    config = build_config("qwen27b-dflash", "full" if cuda else "tiny")
    dtype = torch.bfloat16 if cuda else torch.float32
    # On CUDA the size of benchmarks/: at q 64 over kv 256 (the step's default) torch 2.11's Inductor
    # finds no flex_attention template config on an H200 and fails to compile.
    size = {"blocks": 16, "context_len": 4096} if cuda else {}
    _drafter_module, step = make_drafter_step(config, _device(), dtype, fault, backward=cuda, **size)
    return step


def _inputs(heads: int = 2, kv_heads: int = 2) -> tuple:
    import torch

    grad = _device() == "cuda"  # flex_attention has no backward on the CPU
    q = torch.randn(1, heads, 256, 64, device=_device(), requires_grad=grad)
    kv = torch.randn(1, kv_heads, 256, 64, device=_device(), requires_grad=grad)
    return q, kv


def case_raw_call() -> Callable[[], None]:
    from torch.nn.attention.flex_attention import flex_attention

    q, kv = _inputs()

    def block() -> None:
        out = flex_attention(q, kv, kv)
        if out.requires_grad:
            out.sum().backward()

    return block


def case_dense_on_a_thread() -> Callable[[], None]:
    from torch.nn.attention.flex_attention import flex_attention

    q, kv = _inputs()

    def block() -> None:
        worker = threading.Thread(target=lambda: flex_attention(q, kv, kv), name="loader-3")
        worker.start()
        worker.join()

    return block


def case_eager_wrapper_drafter() -> Callable[[], None]:
    return _drafter("eager-wrapper")


def case_healthy_drafter() -> Callable[[], None]:
    step = _drafter(None)
    step()  # compiled before the block: what a step runs is the question, and it is the same after
    return step


def _limited(calls_before: int) -> Callable[[], None]:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    global OFFSET
    torch._dynamo.config.recompile_limit = 2
    compiled = torch.compile(flex_attention)
    q, kv = _inputs()
    with torch.no_grad():
        for OFFSET in range(calls_before):  # noqa: B007 - the global is what _shifted reads
            compiled(q, kv, kv, score_mod=_shifted)

    def block() -> None:
        global OFFSET
        OFFSET += 1
        with torch.no_grad():
            compiled(q, kv, kv, score_mod=_shifted)

    return block


def case_recompile_limit() -> Callable[[], None]:
    return _limited(2)  # the third value hits the limit inside the block


def case_recompile_limit_before() -> Callable[[], None]:
    return _limited(3)  # hit before the block; the block's call still runs dense under it


def case_skipped_frame() -> Callable[[], None]:
    import torch

    from dflashdoctor.reference.faults import retried_call

    q, kv = _inputs(heads=4, kv_heads=2)

    def block() -> None:
        with torch.no_grad():
            retried_call.flex_attention_forward(q, kv, kv)

    return block


def case_shared_autotuner() -> Callable[[], None]:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernel runs on the CPU
    from dflashdoctor.autotune.stub_kernel import autotuned_add, launch

    inside, release = threading.Event(), threading.Event()

    def bench_hook() -> None:
        if threading.current_thread().name == "pair-0":
            inside.set()
            release.wait(10)

    tuner = autotuned_add(bench_hook)

    def call(index: int) -> None:
        try:
            if index == 1:
                inside.wait(10)
            launch(tuner, index)
        except Exception:  # the race itself may crash a thread; the overlap is what is recorded
            pass
        finally:
            if index == 1:
                release.set()

    def block() -> None:
        pair = [threading.Thread(target=call, args=(i,), name=f"pair-{i}") for i in range(2)]
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join()

    return block


CASES = {
    "cpu": [
        "raw-call",
        "dense-on-a-thread",
        "eager-wrapper-drafter",
        "recompile-limit",
        "recompile-limit-before",
        "skipped-frame",
        "shared-autotuner",
    ],
    "h200": ["raw-call", "eager-wrapper-drafter", "healthy-drafter"],
}


def record_one(case: str, out: Path) -> None:
    """In this process: build the case, record its block, write the observations."""
    build = globals()[f"case_{case.replace('-', '_')}"]()
    import torch

    from dflashdoctor.testing import record

    with record(autotuners=case == "shared-autotuner") as seen:
        build()
    document = {
        "case": case,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "block": asdict(seen.observations()),
    }
    out.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")


def main() -> None:
    if sys.argv[1] == "--one":
        record_one(sys.argv[2], Path(sys.argv[3]))
        return
    machine, wanted = sys.argv[1], sys.argv[2:] or CASES[sys.argv[1]]
    folder = HERE / machine
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for case in wanted:
        out = folder / f"block-{case}.json"
        done = subprocess.run([sys.executable, __file__, "--one", case, str(out)], env=env, check=False)
        print(f"{case}: exit {done.returncode}", flush=True)


if __name__ == "__main__":
    main()
