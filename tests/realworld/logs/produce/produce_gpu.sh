#!/bin/sh
# The GPU logs of this corpus, each run's stdout and stderr as the user's terminal would hold them,
# followed by its exit status. Usage (repository root): sh tests/realworld/logs/produce/produce_gpu.sh OUT_DIR
set -u
out=$1
export PYTHONPATH=.
here=tests/realworld/logs/produce
run() {  # NAME SECONDS COMMAND...
    name=$1 seconds=$2
    shift 2
    timeout "$seconds" "$@" >"$out/$name.log" 2>&1
    echo "exit $?" >>"$out/$name.log"
}
run flex_dense_oom 300 python3 tests/targets/run/grows_until_oom.py
for trial in 1 2 3 4; do  # the race is a matter of timing: the first trial that crashes is kept
    TRITON_CACHE_DIR=$(mktemp -d) && export TRITON_CACHE_DIR
    run autotuner_race 120 python3 $here/autotuner_race_gpu.py
    echo "trial $trial" >>"$out/race_trials.txt"
    tail -1 "$out/autotuner_race.log" | grep -qv "exit 0" && break
done
unset TRITON_CACHE_DIR
sh $here/triton_cache_damage_gpu.sh "$out"
run flex_tiles_oor 240 python3 $here/oversized_tiles_gpu.py
