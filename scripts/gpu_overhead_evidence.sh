#!/usr/bin/env bash
# On one CUDA GPU: what trace-attention's recorders cost a compiled drafter step, on the user-wrapper
# path and on transformers' flex path, at the issue's shape (2048 draft tokens over 4096 context),
# with a 95% interval of each ratio.
#   OUT=/some/dir bash scripts/gpu_overhead_evidence.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
for path in hf-flex wrapper; do
  python3 benchmarks/trace_overhead.py --device cuda --path "$path" --repeats "${REPEATS:-15}" --steps 30 \
    --context 4096 --blocks 128 2>&1 | grep -v Warning | tee -a "$OUT/trace-overhead.txt"
done
