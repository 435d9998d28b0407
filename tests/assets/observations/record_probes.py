"""Records the observations the unit tests judge: each scenario runs the real CLI on this machine
and keeps the observations.json of its report folder as tests/assets/observations/cpu/<name>.json,
and its report.json beside it as <name>.report.json.

    python3 tests/assets/observations/record_probes.py [NAME ...]

The GPU-only recordings (tests/assets/observations/h200/) come from scripts/gpu_observations.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(__file__).parent / "cpu"
TARGETS = ROOT / "tests" / "targets"
REALWORLD = ROOT / "tests" / "realworld"  # real-code cases (tests/integration/test_realworld.py)
FAULTS = "dflashdoctor.reference.faults"
ENTRY = "flex_attention_forward"
WRAPPER = "dflashdoctor.reference.drafter:_compiled_flex_attention"
# Six query heads (not a power of two) over two K/V heads: transformers' flex path repeats K/V.
SIX_HEADS = {
    "model_type": "qwen3",
    "hidden_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 512,
}

SCENARIOS: dict[str, list[str]] = {
    "check-compile-healthy": ["check-compile", "--device", "cpu", "--vary", "2"],
    "check-compile-raw-call": ["check-compile", f"{FAULTS}.raw_call:{ENTRY}", "--device", "cpu", "--vary", "2"],
    "check-compile-rebound": ["check-compile", f"{FAULTS}.rebound:{ENTRY}", "--device", "cpu", "--vary", "0"],
    "check-compile-global-length": [
        *("check-compile", f"{FAULTS}.global_length:{ENTRY}", "--device", "cpu", "--vary", "12")
    ],
    "check-compile-recompiles": ["check-compile", f"{FAULTS}.global_length:{ENTRY}", "--device", "cpu", "--vary", "4"],
    "check-compile-retried-call": ["check-compile", f"{FAULTS}.retried_call:{ENTRY}", "--device", "cpu", "--vary", "2"],
    "check-compile-raises": ["check-compile", f"{TARGETS / 'bad_inputs.py'}:raises", "--device", "cpu"],
    "check-compile-graph-break": [
        *("check-compile", f"{TARGETS / 'compiled_faults.py'}:breaks", "--device", "cpu", "--vary", "1")
    ],
    "check-compile-drift": [
        *("check-compile", f"{TARGETS / 'compiled_faults.py'}:drifts", "--device", "cpu", "--vary", "1")
    ],
    "trace-qwen27b": ["trace-attention", "--model", "qwen27b", "--device", "cpu"],
    "trace-hf-flex-path": [
        *("trace-attention", "--drafter", "--drafter-fault", "hf-flex-path", "--expect-wrapper", WRAPPER)
    ],
    "trace-eager-wrapper": ["trace-attention", "--drafter", "--drafter-fault", "eager-wrapper", "--device", "cpu"],
    "trace-six-heads": ["trace-attention", "--model", "{six_heads}", "--device", "cpu"],
    "trace-script-raises": ["trace-attention", "--script", str(TARGETS / "hf_script.py"), "--", "--fail"],
    "trace-hf-graph-breaks": ["trace-attention", "--script", str(TARGETS / "graph_breaks.py"), "--", "hf"],
    "trace-script-graph-breaks": ["trace-attention", "--script", str(TARGETS / "graph_breaks.py"), "--", "print"],
    "trace-ddp-graph-breaks": ["trace-attention", "--script", str(TARGETS / "ddp_flex.py")],
    "trace-fix-replay": ["trace-attention", "--script", str(TARGETS / "fix_replay.py")],
    "realworld-llama-aot-eager": [
        "trace-attention",
        "--script",
        str(REALWORLD / "hf_llama_compiled.py"),
        "--",
        "--backend",
        "aot_eager",
    ],
    "realworld-llama-static-grow": [
        "trace-attention",
        "--script",
        str(REALWORLD / "hf_llama_compiled.py"),
        "--",
        "--static",
        "--grow",
    ],
    "realworld-packed-static": ["trace-attention", "--script", str(REALWORLD / "packed_static.py")],
    "realworld-prefix-lm-global": ["trace-attention", "--script", str(REALWORLD / "prefix_lm_global.py")],
    "realworld-titan-rebound": ["trace-attention", "--script", str(REALWORLD / "titan_rebound.py"), "--", "--rebind"],
    "race-stub": ["race"],
    "env-hazard": ["env"],
}
ENVIRONMENT = {"env-hazard": {"TORCHDYNAMO_DISABLE": "1"}}


def record(name: str, work: Path) -> None:
    six_heads = work / "six-heads"
    six_heads.mkdir(exist_ok=True)
    (six_heads / "config.json").write_text(json.dumps(SIX_HEADS))
    argv = [arg.replace("{six_heads}", str(six_heads)) for arg in SCENARIOS[name]]
    report = work / name
    place = argv.index("--") if "--" in argv else len(argv)
    argv[place:place] = ["--report-dir", str(report)]
    env = {**os.environ, **ENVIRONMENT.get(name, {}), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "dflashdoctor", *argv], env=env, capture_output=True, text=True)
    results = json.loads((report / "report.json").read_text())["results"]
    codes = sorted({f["code"] for r in results for f in r["findings"]})
    print(f"{name}: exit {done.returncode}, {', '.join(codes) or 'no findings'}")
    shutil.copyfile(report / "observations.json", OUT / f"{name}.json")
    shutil.copyfile(report / "report.json", OUT / f"{name}.report.json")  # what the judge made of it then


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in sys.argv[1:] or SCENARIOS:
            record(name, Path(tmp))


if __name__ == "__main__":
    main()
