#!/usr/bin/env bash
# On a CUDA machine: `dflashdoctor gate` on the embedded reference setup, timed by
# benchmarks/gate_time.py (cold, warm, warm one probe after another, the import-torch floor), and,
# where py-spy is on PATH, one more warm gate under `py-spy record --subprocesses`: where the time goes.
#   OUT=/some/dir REPEATS=2 bash scripts/gpu_gate_evidence.sh
# The last repeat's report folders, the timings and the profile land in $OUT/gate-evidence.tgz.
set -uo pipefail
: "${OUT:?set OUT to the folder the evidence goes to}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
python3 benchmarks/gate_time.py --repeats "${REPEATS:-2}" --keep "$work" 2>&1 | tee "$work/gate-times.txt"
if command -v py-spy >/dev/null; then
  export TRITON_CACHE_DIR="$work/triton-cache" TORCHINDUCTOR_CACHE_DIR="$work/inductor-cache"
  python3 -m dflashdoctor gate --report-dir "$work/gate-fill" >/dev/null 2>&1
  py-spy record --subprocesses --rate 50 --format raw -o "$work/gate-warm.pyspy.txt" \
    -- python3 -m dflashdoctor gate --report-dir "$work/gate-profiled" >"$work/gate-profiled.txt" 2>&1
fi
tar czf "$OUT/gate-evidence.tgz" -C "$work" --exclude triton-cache --exclude inductor-cache .
