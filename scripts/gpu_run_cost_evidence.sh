#!/usr/bin/env bash
# On one CUDA GPU: what `dflashdoctor run` costs a held-out DFlash drafter (benchmarks/held_out_drafter.py,
# hidden 2048, 4 layers, bf16, context 4096), whole processes with the agent loaded each way
# (benchmarks/run_cost_two_ways.py), then one `run` report of the same program.
#   OUT=/some/dir [REPEATS=3] [MODES=plain,run,bootstrap,after-imports,after-model] bash scripts/gpu_run_cost_evidence.sh
# Output: $OUT/gpu.txt, $OUT/run-cost-two-ways.txt, $OUT/run-held-out-drafter.tgz (the run's report).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"
python3 benchmarks/run_cost_two_ways.py --repeats "${REPEATS:-3}" --modes "${MODES:-plain,run,bootstrap,after-imports,after-model}" \
  -- --device cuda --steps 40 --warmup 10 --profile-steps 5 2>&1 | tee "$OUT/run-cost-two-ways.txt"
status=${PIPESTATUS[0]}
report=$(mktemp -d)/run-held-out-drafter
python3 -m dflashdoctor run --report-dir "$report" -- python3 benchmarks/held_out_drafter.py --device cuda --steps 12 --warmup 4 \
  2>&1 | grep -v '^step ' | tee -a "$OUT/run-cost-two-ways.txt"
tar czf "$OUT/run-held-out-drafter.tgz" -C "$(dirname "$report")" run-held-out-drafter
exit "$status"
