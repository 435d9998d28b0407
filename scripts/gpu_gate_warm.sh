#!/usr/bin/env bash
# On one CUDA GPU with FLA installed: the warm gate's wall time, two ways in one call. First
# benchmarks/gate_profile.py (new cache folders, one cold gate, then REPEATS warm ones, each with every
# process's start and end on one clock); then plain gates in the image's default cache folders, as a
# user runs them (one cold, REPEATS warm), each report kept.
#   OUT=/some/dir REPEATS=5 bash scripts/gpu_gate_warm.sh
# Output: $OUT/gate-timeline.txt, $OUT/gate-warm.txt, $OUT/gate-cold/, $OUT/gate-warm-reports.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
root=$PWD
work=$(mktemp -d)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "fla-core", m.version("fla-core"))'
} 2>&1 | tee "$OUT/gate-warm.txt"
python3 benchmarks/gate_profile.py --out "$OUT/profile" --repeats "${REPEATS:-5}" > "$OUT/gate-timeline.txt" 2>&1
{
  for run in cold $(seq 1 "${REPEATS:-5}"); do
    name=$([ "$run" = cold ] && echo cold || echo "warm-$run")
    started=$(date +%s.%N)
    (cd "$work" && python3 -m dflashdoctor gate --report-dir "$OUT/gate-$name" >/dev/null 2>&1)
    code=$?
    echo "gate $name: exit $code in $(python3 -c "print(round($(date +%s.%N) - $started, 2))") s"
  done
} 2>&1 | tee -a "$OUT/gate-warm.txt"
# the reports travel as one archive (a call brings back a bounded number of files)
tar -czf "$OUT/gate-warm-reports.tgz" -C "$OUT" $(cd "$OUT" && ls -d gate-warm-*/) && rm -rf "$OUT"/gate-warm-*/
cd "$root" || exit
