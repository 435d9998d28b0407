#!/usr/bin/env bash
# On one CUDA GPU with FLA installed: the 27B target as users first trace it (forward only, full
# scale), the same with --backward (on Hopper with triton >= 3.4.0 and < 3.7.1, fla-core 0.6.0
# refuses the gated backward: an environment finding), env naming the same guard without running a
# model, and the GPU tests of both.
#   OUT=/some/dir bash scripts/gpu_qwen27b_evidence.sh
# Report folders and console output land in $OUT/qwen27b-evidence.tgz (the tests' in qwen27b-tests.tgz); exit codes and wall times in
# $OUT/qwen27b-runs.txt; the tests' log in $OUT/qwen27b-gpu-tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
reports=$(mktemp -d)

doctor() {
  local name=$1
  shift
  local started=$SECONDS
  python3 -m dflashdoctor "$@" --report-dir "$reports/$name" >"$reports/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/qwen27b-runs.txt"
}

python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, torch.cuda.get_device_name())" | tee "$OUT/qwen27b-runs.txt"
doctor h200-env-fla env
doctor h200-trace-qwen27b-full trace-attention --model qwen27b --device cuda
doctor h200-trace-qwen27b-full-backward trace-attention --model qwen27b --device cuda --backward
tar czf "$OUT/qwen27b-evidence.tgz" -C "$reports" .
tests=$(mktemp -d)
DFLASHDOCTOR_EVIDENCE_DIR="$tests" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/integration/test_fla_guards.py tests/integration/test_gpu.py -k "qwen27b or fla or env" 2>&1 | tee "$OUT/qwen27b-gpu-tests.log"
tar czf "$OUT/qwen27b-tests.tgz" -C "$tests" .
