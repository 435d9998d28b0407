#!/usr/bin/env bash
# On one CUDA GPU, issue 22's figures in one call: what run's agent costs a compiled drafter step
# (transformers' flex path and a user wrapper, in-process A/B with a 95% interval), then the gate's
# figures (scripts/gpu_probe_host_evidence.sh: the probe host, the gate cold and warm against its floors).
#   OUT=/some/dir [BASELINE=.baseline] [REPEATS=12] bash scripts/gpu_speed_evidence.sh
# Output: $OUT/run-agent-overhead.txt and what gpu_probe_host_evidence.sh writes.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  for path in hf-flex wrapper; do
    (cd benchmarks && python3 run_agent_overhead.py --device cuda --path "$path" --repeats "${REPEATS:-12}" \
      --steps 30 --context 4096 --blocks 128) 2>&1 | grep -v Warning
  done
} 2>&1 | tee "$OUT/run-agent-overhead.txt"
bash scripts/gpu_probe_host_evidence.sh
