#!/usr/bin/env bash
# On a machine with two CUDA GPUs (nvidia-h200-x2): the two-node run with NCCL, one GPU per node.
#   OUT=/some/dir bash scripts/gpu_two_node_evidence.sh
# The merged report and both nodes' parts land in $OUT/two-nodes.tgz, the pytest log in $OUT/two-nodes.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
evidence=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/two-nodes.log"
DFLASHDOCTOR_EVIDENCE_DIR="$evidence" python3 -m pytest -m gpu tests/integration/test_gpu_two_nodes.py -v \
  -p no:cacheprovider 2>&1 | tee -a "$OUT/two-nodes.log"
status=${PIPESTATUS[0]}
tar czf "$OUT/two-nodes.tgz" -C "$evidence" .
exit "$status"
