#!/usr/bin/env bash
# On one CUDA GPU with FLA installed: the warm gate's wall time (reports kept), then the gate with and
# without `run` of the reference trainer (benchmarks/gate_run_time.py).
#   OUT=/some/dir REPEATS=2 bash scripts/gpu_gate_run_time.sh
# Output: $OUT/gate-warm.txt, $OUT/h200-gate-fla-{cold,warm-1,warm-2,warm-3}/, $OUT/gate-run-time.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
root=$PWD
work=$(mktemp -d)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "fla-core", m.version("fla-core"))'
  for run in cold warm-1 warm-2 warm-3; do
    started=$(date +%s.%N)
    (cd "$work" && python3 -m dflashdoctor gate --report-dir "$OUT/h200-gate-fla-$run" >/dev/null 2>&1)
    code=$?
    echo "gate $run: exit $code in $(python3 -c "print(round($(date +%s.%N) - $started, 1))") s"
  done
} 2>&1 | tee "$OUT/gate-warm.txt"
python3 "$root/benchmarks/gate_run_time.py" --repeats "${REPEATS:-2}" 2>&1 | tee "$OUT/gate-run-time.txt"
