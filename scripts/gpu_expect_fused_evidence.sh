#!/usr/bin/env bash
# On one CUDA GPU: dflashdoctor.testing over the reference drafter's real training step.
#   OUT=/some/dir bash scripts/gpu_expect_fused_evidence.sh
# $OUT/expect-fused-tests.log: the GPU test (pytest running the docs' training-step example and the
# eager-wrapper fault, as a user's suite does) and its evidence folder in $OUT/expect-fused.tgz;
# $OUT/blocks.tgz: the blocks recorded for the unit tests (tests/assets/observations/h200/);
# $OUT/expect-fused-overhead.txt: benchmarks/expect_fused_overhead.py.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Where dflashdoctor is not installed its pytest11 entry point is not either: load the plugin by name.
python3 -c 'import importlib.metadata as m, sys; sys.exit(not [e for e in m.entry_points(group="pytest11") if e.name == "dflashdoctor"])' \
  || export PYTEST_PLUGINS=dflashdoctor.pytest_plugin
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' | tee "$OUT/expect-fused-tests.log"
evidence=$(mktemp -d)
started=$SECONDS
python3 tests/assets/observations/record_blocks.py h200 2>&1 | grep -E ': exit' | tee -a "$OUT/expect-fused-tests.log"
tar czf "$OUT/blocks.tgz" -C tests/assets/observations h200
echo "recorded in $((SECONDS - started)) s" | tee -a "$OUT/expect-fused-tests.log"
DFLASHDOCTOR_EVIDENCE_DIR="$evidence" python3 -m pytest -m gpu tests/integration/test_gpu_expect_fused.py -v \
  -p no:cacheprovider 2>&1 | tee -a "$OUT/expect-fused-tests.log"
status=${PIPESTATUS[0]}
tar czf "$OUT/expect-fused.tgz" -C "$evidence" .
for shape in "--context 4096 --blocks 16" "--context 8192 --blocks 128"; do
  python3 benchmarks/expect_fused_overhead.py --device cuda --repeats 20 $shape 2>&1 | grep -v Warning \
    | tee -a "$OUT/expect-fused-overhead.txt"
done
exit "$status"
