#!/usr/bin/env bash
# On a CUDA machine: run the GPU tests, keeping every report they write, and pack them.
#   OUT=/some/dir bash scripts/gpu_evidence.sh [PYTEST_K_EXPRESSION]
# The reports land in $OUT/evidence.tgz (one folder per test) and the pytest log in $OUT/gpu-tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
evidence=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
python3 -c 'import fla; print("fla", fla.__version__)' 2>/dev/null | tee -a "$OUT/gpu.txt"
# the configured testpaths (tests/unit, tests/integration), not tests/: the copied real-world
# repositories under tests/realworld hold test files of their own that do not import here
DFLASHDOCTOR_EVIDENCE_DIR="$evidence" python3 -m pytest -m gpu -v -p no:cacheprovider ${1:+-k "$1"} 2>&1 \
  | tee "$OUT/gpu-tests.log"
status=${PIPESTATUS[0]}
tar czf "$OUT/evidence.tgz" -C "$evidence" .
exit "$status"
