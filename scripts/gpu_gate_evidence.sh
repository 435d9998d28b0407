#!/usr/bin/env bash
# On a CUDA machine: `dflashdoctor gate` on the embedded reference setup, cold (empty Triton and
# Inductor caches) then warm twice (the same caches again), timed; then, where py-spy is on PATH,
# one more warm gate under `py-spy record --subprocesses` to show where the time goes.
#   OUT=/some/dir bash scripts/gpu_gate_evidence.sh
# Report folders, console output, times and the profile land in $OUT/gate-evidence.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
export TRITON_CACHE_DIR="$work/triton-cache" TORCHINDUCTOR_CACHE_DIR="$work/inductor-cache"
timed() {  # label, command...: wall seconds to gate-times.txt
  local label=$1; shift
  local started; started=$(date +%s.%N)
  "$@"; local rc=$?
  python3 -c "import sys; print(f'{sys.argv[1]}: exit {sys.argv[2]} in {float(sys.argv[4]) - float(sys.argv[3]):.1f} s')" \
    "$label" "$rc" "$started" "$(date +%s.%N)" | tee -a "$work/gate-times.txt"
}
timed "import torch" python3 -c "import torch"
timed "import torch + CUDA init" python3 -c "import torch; torch.zeros(1, device='cuda')"
for pass in cold warm warm2; do
  timed "gate $pass" python3 -m dflashdoctor gate --report-dir "$work/h200-gate-$pass" >"$work/h200-gate-$pass.txt" 2>&1
done
if command -v py-spy >/dev/null; then
  timed "gate warm under py-spy" py-spy record --subprocesses --rate 50 --format raw -o "$work/gate-warm.pyspy.txt" \
    -- python3 -m dflashdoctor gate --report-dir "$work/gate-profiled" >"$work/gate-profiled.txt" 2>&1
fi
tar czf "$OUT/gate-evidence.tgz" -C "$work" --exclude triton-cache --exclude inductor-cache .
