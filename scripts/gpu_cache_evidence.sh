#!/usr/bin/env bash
# On a CUDA machine with fla-core: make a real cache (flex_attention compiled forward and backward by
# Inductor, FLA's gated delta rule with its autotune results stored), then `cache check` it.
#   OUT=/some/dir bash scripts/gpu_cache_evidence.sh
# The report folder and console output land in $OUT/cache-evidence.tgz.
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
python3 -m dflashdoctor cache check --all-roots --report-dir "$work/h200-cache-check" >"$work/h200-cache-check.txt" 2>&1
echo "cache check: exit $?" | tee "$OUT/cache-runs.txt"
find "$work/inductor" "$HOME/.triton/cache" -name "*.autotune.json" 2>/dev/null | wc -l | sed 's/^/autotune files: /' | tee -a "$OUT/cache-runs.txt"
tar czf "$OUT/cache-evidence.tgz" -C "$work" h200-cache-check h200-cache-check.txt
