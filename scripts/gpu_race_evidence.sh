#!/usr/bin/env bash
# On a CUDA machine with fla-core (two GPUs for the data-parallel layout): the race runs kept under
# reports/examples/, and the guard's cost on real FLA calls.
#   OUT=/some/dir bash scripts/gpu_race_evidence.sh [fla|reference|bench]...   (default: all three)
# Report folders and console output land in $OUT/race-evidence.tgz, packed again as each run ends
# (a run cut short loses only itself; one archive, since the device tool brings back few files); exit codes and wall times in $OUT/race-runs.txt; the benchmark's output in
# $OUT/autotuner_guard.txt. The runs share one folder of compiled binaries (each trial still tunes
# cold; the reports check it).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
reports=$(mktemp -d)
binaries=$(mktemp -d)

race() {
  local name=$1
  shift
  local started=$SECONDS
  python3 -m dflashdoctor race --report-dir "$reports/$name" --triton-binaries "$binaries" "$@" >"$reports/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/race-runs.txt"
  tar czf "$OUT/race-evidence.tgz" -C "$reports" .
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(fla reference bench)
for what in "${parts[@]}"; do
  case $what in
  fla)
    race h200x2-race-fla --kernel fla --threads 2 --trials 5
    race h200x2-race-fla-fix-lock --kernel fla --threads 2 --trials 5 --fix lock
    race h200x2-race-fla-fix-sequential --kernel fla --threads 2 --trials 5 --fix sequential
    ;;
  reference)
    race h200x2-race-reference --kernel reference --threads 2 --trials 3
    race h200x2-race-reference-fix-sequential --kernel reference --threads 2 --trials 3 --fix sequential
    ;;
  bench) TRITON_CACHE_DIR="$binaries" python3 benchmarks/autotuner_guard.py --device cuda 2>&1 | tee "$OUT/autotuner_guard.txt" ;;
  *) echo "unknown part $what (fla, reference, bench)" >&2 && exit 2 ;;
  esac
done
