#!/usr/bin/env bash
# On a CUDA machine: the corpus's GPU cases (tests/realworld/corpus.py, forward and backward at seq 2048)
# scored by benchmarks/accuracy.py --device cuda, each case's report kept; then the profiler's ground
# truth (tests/realworld/ground_truth.py) for the cases whose dense backward only a GPU shows, and the
# GPU test of the fix replay.
#   OUT=/some/dir [ONLY=titan,disable] bash scripts/gpu_cause_evidence.sh
# accelerate, when the machine lacks it, is installed from wheels carried in .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import accelerate' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"
reports=$(mktemp -d)
timeout "${CASES_S:-420}" python3 benchmarks/accuracy.py --device cuda --only "${ONLY:-}" --reports "$reports" \
  --json "$OUT/scores.json" 2>&1 | tee "$OUT/scoreboard.md"
status=${PIPESTATUS[0]}
tar czf "$OUT/reports.tgz" -C "$reports" .
cd tests/realworld
truth_cases=("titan_per_block.py --backend aot_eager" "reentrant_checkpoint.py --compile-model --raw")
for case in "${truth_cases[@]}"; do
  echo "== truth: $case" | tee -a "$OUT/truth.txt"
  timeout 120 python3 ground_truth.py $case --device cuda --train --seq 2048 2>/dev/null | tail -1 | tee -a "$OUT/truth.txt"
done
cd ../..
timeout 100 python3 -m pytest -m gpu tests/integration/test_fix_replay.py -q -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/fix-replay-test.txt"
exit "$status"
