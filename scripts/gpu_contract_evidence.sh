#!/usr/bin/env bash
# On a CUDA machine with fla-core: the exit-code contract where a GPU changes the answer.
#   OUT=/some/dir bash scripts/gpu_contract_evidence.sh
# - FLA's real race, unfixed: still `autotuner-race` (the failure passes through triton's autotuner),
#   now that a failure outside any autotuner is the target's own (`target-raised`);
# - a workload that raises on the GPU without touching triton: `target-raised`, not the race;
# - check-compile at a shape whose inputs do not fit the GPU: bad input (exit 2), not a crash;
# - a target whose message holds control characters, markup and a lone surrogate, on CUDA: exit 1,
#   every report file valid;
# - the reference trainer under `run --json`: stdout is exactly one JSON document.
# Report folders and console output land in $OUT/contract-evidence.tgz; exit codes and times in
# $OUT/contract-runs.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)

step() {
  local name=$1
  shift
  local started=$SECONDS
  "$@" >"$work/$name.txt" 2>"$work/$name.err"
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/contract-runs.txt"
  tar czf "$OUT/contract-evidence.tgz" -C "$work" .
}

doctor() { python3 -m dflashdoctor "$@"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/contract-runs.txt"
cat >"$work/workload_raises.py" <<'EOF'
import torch


def fn(worker, device):
    torch.ones(4, device=device).sum()
    raise ValueError("the workload's own bug, on the GPU")
EOF
cat >"$work/target_hostile.py" <<'EOF'
def fn(query, key, value, block_mask=None, enable_gqa=False):
    raise RuntimeError("\x1b[31mred\x07 \x00 <script>alert(1)</script> `tick` bad \udcff name")
EOF

step h200-contract-race-fla doctor race --kernel fla --threads 2 --trials 2 --report-dir "$work/h200-contract-race-fla"
step h200-contract-race-target doctor race --kernel "$work/workload_raises.py:fn" --threads 2 --trials 1 \
  --report-dir "$work/h200-contract-race-target"
step h200-contract-inputs-do-not-fit doctor check-compile --device cuda --q-len 4000000 --kv-len 8000000 --vary 0 \
  --report-dir "$work/h200-contract-inputs-do-not-fit"
step h200-contract-hostile-message doctor check-compile "$work/target_hostile.py:fn" --device cuda --vary 0 \
  --report-dir "$work/h200-contract-hostile-message"
step h200-contract-run-json doctor run --json --report-dir "$work/h200-contract-run-json" -- \
  python3 -m dflashdoctor.reference.trainer --steps 2
python3 - "$work" <<'EOF' | tee -a "$OUT/contract-runs.txt"
import json, sys
from pathlib import Path
from xml.etree import ElementTree as ET

work = Path(sys.argv[1])
document = json.loads((work / "h200-contract-run-json.txt").read_text())
print(f"run --json: one JSON document on stdout, verdict {document['verdict']}")
hostile = work / "h200-contract-hostile-message"
ET.parse(hostile / "junit.xml")
json.loads((hostile / "report.sarif").read_text())
html = (hostile / "report.html").read_text()
print("hostile message: junit.xml and report.sarif parse;", "no raw <script> in report.html" if "<script>" not in html else "RAW TAG")
for name in ("h200-contract-race-fla", "h200-contract-race-target"):
    report = json.loads((work / name / "report.json").read_text())
    codes = sorted({f["code"] for r in report["results"] for f in r["findings"]})
    print(f"{name}: verdict {report['verdict']}, codes {codes}")
EOF
tar czf "$OUT/contract-evidence.tgz" -C "$work" .
