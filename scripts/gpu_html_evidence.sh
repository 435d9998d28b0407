#!/usr/bin/env bash
# On one CUDA GPU: a run whose dense flex_attention grows each step until it runs out of memory, for
# the HTML report's per-step memory chart with the dense and out-of-memory steps marked.
#   OUT=/some/dir bash scripts/gpu_html_evidence.sh
# The report folder lands in $OUT/run-grows-until-oom.tgz, the console output in $OUT/run-grows-until-oom.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
python3 -m dflashdoctor run --report-dir "$work/h200-run-grows-until-oom" --hang-timeout 120 -- \
  python3 tests/targets/run/grows_until_oom.py >"$OUT/run-grows-until-oom.txt" 2>&1
echo "exit $?" >>"$OUT/run-grows-until-oom.txt"
tar czf "$OUT/run-grows-until-oom.tgz" -C "$work" h200-run-grows-until-oom
