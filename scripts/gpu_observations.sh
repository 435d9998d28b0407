#!/usr/bin/env bash
# On one CUDA GPU with FLA installed: the runs whose findings only a GPU can show, each keeping its
# observations.json, so that their judging is tested on a CPU (tests/assets/observations/h200/).
#   OUT=/some/dir bash scripts/gpu_observations.sh
# Each run's report folder lands in $OUT/observations.tgz; exit codes and wall times in $OUT/runs.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
reports=$(mktemp -d)
faults=dflashdoctor.reference.faults
entry=flex_attention_forward

doctor() {
  local name=$1
  shift
  local started=$SECONDS
  python3 -m dflashdoctor "$@" --report-dir "$reports/$name" >"$reports/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/runs.txt"
}

python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, torch.cuda.get_device_name())" | tee "$OUT/runs.txt"
doctor check-compile-healthy check-compile --device cuda --vary 2
doctor check-compile-raw-call check-compile "$faults.raw_call:$entry" --device cuda --vary 1
doctor check-compile-oom check-compile "$faults.raw_call:$entry" --device cuda --kv-len 1048576 --mask none --vary 1
doctor check-compile-global-length check-compile "$faults.global_length:$entry" --device cuda --vary 12 --q-len 512 --kv-len 2560
doctor check-compile-retried-call check-compile "$faults.retried_call:$entry" --device cuda --vary 2
doctor trace-drafter-eager-wrapper trace-attention --device cuda --drafter --drafter-fault eager-wrapper --seq-len 2048
doctor trace-qwen27b-tiny-backward trace-attention --device cuda --model qwen27b --scale tiny --backward
doctor env-fla env
doctor race-fla race --kernel fla --trials 3
tar czf "$OUT/observations.tgz" -C "$reports" .
