#!/usr/bin/env bash
# On a CUDA machine: the drafter's trace-attention runs kept under reports/examples/, and the overhead
# benchmark (the 27B target alone: scripts/gpu_qwen27b_evidence.sh).
#   OUT=/some/dir bash scripts/gpu_trace_evidence.sh
# Each run's report folder and console output land in $OUT/trace-evidence.tgz; exit codes in
# $OUT/trace-runs.txt; the benchmark's output in $OUT/trace_overhead.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
reports=$(mktemp -d)
wrapper=dflashdoctor.reference.drafter:_compiled_flex_attention

trace() {
  local name=$1
  shift
  local started=$SECONDS
  python3 -m dflashdoctor trace-attention --device cuda --report-dir "$reports/$name" "$@" >"$reports/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/trace-runs.txt"
}

trace h200-trace-qwen27b-drafter --model qwen27b --drafter --expect-wrapper "$wrapper"
trace h200-trace-drafter-healthy --drafter --seq-len 8192 --expect-wrapper "$wrapper"
trace h200-trace-drafter-hf-flex-path --drafter --drafter-fault hf-flex-path --seq-len 8192 --expect-wrapper "$wrapper"
trace h200-trace-drafter-eager-wrapper --drafter --drafter-fault eager-wrapper --seq-len 8192
python3 benchmarks/trace_overhead.py --device cuda 2>&1 | tee "$OUT/trace_overhead.txt"
python3 benchmarks/trace_overhead.py --device cuda --context 8192 --blocks 128 2>&1 | tee -a "$OUT/trace_overhead.txt"
tar czf "$OUT/trace-evidence.tgz" -C "$reports" .
