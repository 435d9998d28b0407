#!/usr/bin/env bash
# On a CUDA machine: the real-code cases forward and backward (tests/integration/test_gpu_realworld.py),
# with every report they write, then the per-case table (scripts/realworld_table.py: ground truth,
# verdict, cause, and the wall time of the plain script, trace-attention and run).
#   OUT=/some/dir [SELECT='static or tiles'] [ONLY=drafter,static] [SKIP=titan] bash scripts/gpu_realworld_evidence.sh [tests|table|all]
# SELECT picks tests (pytest -k), ONLY and SKIP pick table cases (scripts/realworld_table.py --only, --skip).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
part=${1:-all}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"
status=0
if [ "$part" != table ]; then
  evidence=$(mktemp -d)
  DFLASHDOCTOR_EVIDENCE_DIR="$evidence" python3 -m pytest -m gpu tests/integration/test_gpu_realworld.py -v \
    ${SELECT:+-k "$SELECT"} -p no:cacheprovider 2>&1 | tee "$OUT/gpu-realworld-tests.log"
  status=${PIPESTATUS[0]}
  tar czf "$OUT/evidence.tgz" -C "$evidence" .
fi
if [ "$part" != tests ]; then
  python3 scripts/realworld_table.py --device cuda --only "${ONLY:-}" --skip "${SKIP:-}" 2>&1 | tee "$OUT/realworld-table.md"
  status=$((status || PIPESTATUS[0]))
fi
exit "$status"
