#!/usr/bin/env bash
# On a CUDA machine: `dflashdoctor gate` on the embedded reference setup, cold (empty Triton and
# Inductor caches) then warm (the same caches again), timed.
#   OUT=/some/dir bash scripts/gpu_gate_evidence.sh
# Report folders, console output and times land in $OUT/gate-evidence.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
export TRITON_CACHE_DIR="$work/triton-cache" TORCHINDUCTOR_CACHE_DIR="$work/inductor-cache"
for pass in cold warm; do
  started=$SECONDS
  python3 -m dflashdoctor gate --report-dir "$work/h200-gate-$pass" >"$work/h200-gate-$pass.txt" 2>&1
  echo "gate $pass: exit $? in $((SECONDS - started)) s" | tee -a "$work/gate-times.txt"
done
tar czf "$OUT/gate-evidence.tgz" -C "$work" --exclude triton-cache --exclude inductor-cache .
