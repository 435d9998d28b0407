#!/bin/sh
# A Triton cache damaged between two runs of the same step (a node killed while writing, a shared
# cache folder written by two jobs): the first run of cache_step_gpu.py fills a fresh
# TRITON_CACHE_DIR, then the kernel's metadata JSON (log 38) or its cubin (log 40) is cut to half its
# length, and the step runs again. Needs a GPU. Usage: triton_cache_damage_gpu.sh OUT_DIR
set -u
out=$1
here=$(dirname "$0")
for part in json cubin; do
    cache=$(mktemp -d)
    TRITON_CACHE_DIR=$cache python3 "$here/cache_step_gpu.py" >/dev/null 2>&1
    find "$cache" -name "rms_norm_kernel.$part" | while read -r file; do
        truncate -s $(($(stat -c %s "$file") / 2)) "$file"
    done
    TRITON_CACHE_DIR=$cache python3 "$here/cache_step_gpu.py" >"$out/cache_$part.log" 2>&1
    echo "exit $?" >>"$out/cache_$part.log"
done
