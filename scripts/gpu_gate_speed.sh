#!/usr/bin/env bash
# On one CUDA GPU: the gate's wall time, this version against another in the same run.
#   OUT=/some/dir BASELINE=.baseline bash scripts/gpu_gate_speed.sh
# BASELINE is a folder holding another version's dflashdoctor/ and probes/ (git archive REV
# dflashdoctor probes | tar -x -C DIR). Output: $OUT/gate-speed.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
unset PYTHONPATH
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'
  env | grep -E '^PYTHON(DONTWRITEBYTECODE|PYCACHEPREFIX)=' || true
  for package in "$PWD" "${BASELINE:-}"; do
    [ -n "$package" ] && [ -d "$package/dflashdoctor" ] || continue
    python3 benchmarks/gate_time.py --repeats "${REPEATS:-2}" --no-sequential --package "$package"
  done
} 2>&1 | tee "$OUT/gate-speed.txt"
