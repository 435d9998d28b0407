#!/usr/bin/env bash
# On a CUDA machine (two GPUs for the data-parallel pairs, fla-core for the autotuner fault): the
# reference trainer under `dflashdoctor run`, each fault switch, and what `run` costs a step.
#   OUT=/some/dir bash scripts/gpu_run_evidence.sh [tests|recompile|bench]...   (default: tests bench)
# The GPU tests' report folders and logs land in $OUT/run-evidence.tgz (memory snapshots left out:
# their size is listed instead); the benchmark's output in $OUT/run_overhead.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
evidence=$(mktemp -d)
pack() {
  find "$evidence" -name "*.pickle" -exec ls -l {} \; >"$evidence/memory-snapshots.txt"
  tar czf "$OUT/run-evidence.tgz" -C "$evidence" --exclude "*.pickle" .
}
tests() {
  local name=$1
  shift
  local started=$SECONDS
  DFLASHDOCTOR_EVIDENCE_DIR="$evidence/reports" python3 -m pytest -m gpu tests/integration/test_gpu_run.py -q -p no:cacheprovider \
    "$@" >"$evidence/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$evidence/runs.txt"
  pack
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$evidence/gpu.txt"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests bench)
for what in "${parts[@]}"; do
  case $what in
  tests) tests gpu-run-tests -k "not recompile" ;;
  recompile) tests gpu-run-recompile -k recompile ;;
  bench) python3 benchmarks/run_overhead.py --steps 15 --warmup 5 --repeats 3 2>&1 | tee "$OUT/run_overhead.txt" ;;
  *) echo "unknown part $what (tests, recompile, bench)" >&2 && exit 2 ;;
  esac
done
