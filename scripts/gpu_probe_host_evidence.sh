#!/usr/bin/env bash
# On one CUDA GPU: what `import torch` leaves of the CUDA driver (loaded, initialised, device files
# held), the probe host's own answer, then the gate's wall time against its floors, this version and
# (if given) another in the same run; the last warm and cold gates' report.json and report.md kept.
#   OUT=/some/dir [BASELINE=.baseline] bash scripts/gpu_probe_host_evidence.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 - <<'PY'
import os
import torch
maps = open("/proc/self/maps").read()
held = sorted({os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")})
print("torch", torch.__version__)
print("after import torch: libcuda.so.1 mapped:", "libcuda.so.1" in maps, "| torch.cuda.is_initialized():",
      torch.cuda.is_initialized(), "| /dev/nvidia* held:", [p for p in held if p.startswith("/dev/nvidia")])
torch.zeros(1, device="cuda")
held = sorted({os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")})
print("after a CUDA tensor: /dev/nvidia* held:", [p for p in held if p.startswith("/dev/nvidia")][:4], "...")
PY
  echo "probe host, --device cuda:"
  python3 -m dflashdoctor.forkserver.server --device cuda < /dev/null
  echo
} 2>&1 | tee "$OUT/cuda-at-import.txt"
{
  for package in "$PWD" "${BASELINE:-}"; do
    [ -n "$package" ] && [ -d "$package/dflashdoctor" ] || continue
    keep=()
    [ "$package" = "$PWD" ] && keep=(--keep "$OUT")
    python3 benchmarks/gate_time.py --repeats "${GATE_REPEATS:-2}" --no-sequential --package "$package" "${keep[@]}"
  done
} 2>&1 | tee "$OUT/gate-speed.txt"
find "$OUT" -path "$OUT/gate-*/*" -type f ! -name report.json ! -name report.md -delete
