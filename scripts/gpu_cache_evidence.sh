#!/usr/bin/env bash
# On a CUDA machine with fla-core: make a real cache (flex_attention compiled forward and backward by
# Inductor, FLA's gated delta rule with its autotune results stored), then `cache check` it.
#   OUT=/some/dir bash scripts/gpu_cache_evidence.sh
# Then the repair cycle on that real cache: truncate one cubin, check (the one entry found), fix,
# check (clean), restore, and compare the tree with its state before the fix: byte-identical (restore
# puts back what fix moved, the damaged entry included, by the user's choice).
# The report folders and console output land in $OUT/cache-evidence.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
export TORCHINDUCTOR_CACHE_DIR="$work/inductor" FLA_CACHE_RESULTS=1
unset TRITON_CACHE_DIR  # Inductor's kernels go to $TORCHINDUCTOR_CACHE_DIR/triton/<device>
python3 - <<'PY'
import torch
from torch.nn.attention.flex_attention import flex_attention

from dflashdoctor.autotune.fla_workload import gated_delta_rule_forward

q, k, v = (torch.randn(1, 8, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
torch.compile(flex_attention)(q, k, v).sum().backward()
gated_delta_rule_forward(0, "cuda")
torch.cuda.synchronize()
print("cache made")
PY

cache() {
  local name=$1
  shift
  local started=$SECONDS
  python3 -m dflashdoctor cache "$@" --all-roots --report-dir "$work/$name" >"$work/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/cache-runs.txt"
  tar czf "$OUT/cache-evidence.tgz" -C "$work" --exclude inductor .
}

tree_digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16); }

# FLA's kernels land in Inductor's per-device folder when torch.compile ran first in the process
# (seen on the H200), else in ~/.triton/cache: look in both.
roots=("$work/inductor/triton" "$HOME/.triton/cache")
find "${roots[@]}" -name "*.autotune.json" 2>/dev/null | wc -l | sed 's/^/autotune files: /' | tee -a "$OUT/cache-runs.txt"
cache h200-cache-check check
victim=$(find "${roots[@]}" -name "*.cubin" -size +8k 2>/dev/null | sort | head -n 1)
triton_root=$(dirname "$(dirname "$victim")")
echo "damage: truncate $victim ($(stat -c %s "$victim") bytes) to 4096 bytes" | tee -a "$OUT/cache-runs.txt"
truncate -s 4096 "$victim"
before=$(tree_digest "$triton_root")
cache h200-cache-check-damaged check
cache h200-cache-fix fix
cache h200-cache-check-after-fix check
cache h200-cache-restore restore
after=$(tree_digest "$triton_root")
echo "triton root digest before fix $before, after restore $after" | tee -a "$OUT/cache-runs.txt"
tar czf "$OUT/cache-evidence.tgz" -C "$work" --exclude inductor .
