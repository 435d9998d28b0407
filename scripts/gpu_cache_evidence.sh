#!/usr/bin/env bash
# On a CUDA machine with fla-core: make a real cache (flex_attention compiled forward and backward by
# Inductor, FLA's gated delta rule with its autotune results stored), then `cache check` it.
#   OUT=/some/dir bash scripts/gpu_cache_evidence.sh
# Then the repair cycle on that real cache: truncate one cubin, check (the one entry found), fix,
# check (clean), restore, and compare the tree with its state before the fix: byte-identical (restore
# puts back what fix moved, the damaged entry included, by the user's choice). Then the root checked
# through a link to its folder, and two fixes started together followed by one plain restore.
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
  python3 -m dflashdoctor cache "$@" --report-dir "$work/$name" >"$work/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/cache-runs.txt"
  tar czf "$OUT/cache-evidence.tgz" -C "$work" --exclude inductor .
}

tree_digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16); }

# FLA's kernels land in Inductor's per-device folder when torch.compile ran first in the process
# (seen on the H200), else in ~/.triton/cache: look in both.
roots=("$work/inductor/triton" "$HOME/.triton/cache")
cubins() { find "${roots[@]}" -name "*.cubin" -size +8k 2>/dev/null | sort; }
find "${roots[@]}" -name "*.autotune.json" 2>/dev/null | wc -l | sed 's/^/autotune files: /' | tee -a "$OUT/cache-runs.txt"
cache h200-cache-check check --all-roots
victim=$(cubins | head -n 1)
triton_root=$(dirname "$(dirname "$victim")")
# The same healthy root reached through a link, as clusters link ~/.triton to scratch: triton's group
# files name the real path, and the check compares folders, not strings.
ln -s "$(dirname "$triton_root")" "$work/linked"
cache h200-cache-check-through-link check --triton-dir "$work/linked/$(basename "$triton_root")"
echo "damage: truncate $victim ($(stat -c %s "$victim") bytes) to 4096 bytes" | tee -a "$OUT/cache-runs.txt"
truncate -s 4096 "$victim"
before=$(tree_digest "$triton_root")
cache h200-cache-check-damaged check --all-roots
cache h200-cache-fix fix --all-roots
cache h200-cache-check-after-fix check --all-roots
cache h200-cache-restore restore --all-roots
after=$(tree_digest "$triton_root")
echo "triton root digest before fix $before, after restore $after" | tee -a "$OUT/cache-runs.txt"


# Two fixes started together on the real cache (the restored damage and two more cubins truncated),
# then one plain restore.
for cubin in $(cubins | sed -n '2,3p'); do truncate -s 4096 "$cubin"; done
before=$(tree_digest "$triton_root")
for side in a b; do
  (python3 -m dflashdoctor cache fix --all-roots --report-dir "$work/h200-cache-fix-$side" >"$work/h200-cache-fix-$side.txt" 2>&1
   echo "h200-cache-fix-$side (at once): exit $?" | tee -a "$OUT/cache-runs.txt") &
done
wait
cache h200-cache-restore-after-two-fixes restore --all-roots
after=$(tree_digest "$triton_root")
echo "two fixes at once: triton root digest before $before, after restore $after" | tee -a "$OUT/cache-runs.txt"
tar czf "$OUT/cache-evidence.tgz" -C "$work" --exclude inductor --exclude linked .
