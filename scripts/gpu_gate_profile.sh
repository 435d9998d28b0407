#!/usr/bin/env bash
# On one CUDA GPU: where the warm gate's wall time goes (benchmarks/gate_profile.py), for this
# version and, with BASELINE (a folder holding another version's dflashdoctor/ and probes/), for that.
#   OUT=/some/dir [BASELINE=.baseline] [REPEATS=3] bash scripts/gpu_gate_profile.sh
# Output: $OUT/gate-profile.txt, $OUT/profile/*.prof.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, importlib.metadata as m
try:
    fla = m.version("fla-core")
except m.PackageNotFoundError:
    fla = "not installed"
print("torch", torch.__version__, "fla-core", fla)'
  python3 -c 'import sitecustomize; print("image sitecustomize:", sitecustomize.__file__)' 2>/dev/null || echo "image sitecustomize: none"
  env | grep -E '^PYTHON(DONTWRITEBYTECODE|PYCACHEPREFIX)=' || true
  python3 benchmarks/gate_profile.py --out "$OUT/profile" --repeats "${REPEATS:-3}" --profile
  if [ -n "${BASELINE:-}" ]; then
    python3 benchmarks/gate_profile.py --out "$OUT/baseline" --repeats "${REPEATS:-3}" --package "$BASELINE"
  fi
} 2>&1 | tee "$OUT/gate-profile.txt"
