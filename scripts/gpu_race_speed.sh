#!/usr/bin/env bash
# On a CUDA machine with fla-core: race's time per trial on FLA's kernels, this version against
# another in the same run (benchmarks/race_time.py), this version's reports kept.
#   OUT=/some/dir BASELINE=.baseline TRIALS=3 bash scripts/gpu_race_speed.sh
# BASELINE holds another version's dflashdoctor/ and probes/ (git archive REV dflashdoctor probes |
# tar -x -C DIR). Output: $OUT/race-speed.txt and $OUT/race-speed.tgz (the reports).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
keep=$(mktemp -d)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton, fla; print("torch", torch.__version__, "triton", triton.__version__, "fla", fla.__version__)'
  baseline=()
  [ -n "${BASELINE:-}" ] && [ -d "$BASELINE/dflashdoctor" ] && baseline=(--baseline "$BASELINE")
  python3 benchmarks/race_time.py --kernel fla --trials "${TRIALS:-3}" --repeats "${REPEATS:-1}" \
    --timeout "${RACE_TIMEOUT:-240}" --keep "$keep" "${baseline[@]}"
} 2>&1 | tee "$OUT/race-speed.txt"
tar czf "$OUT/race-speed.tgz" -C "$keep" .
