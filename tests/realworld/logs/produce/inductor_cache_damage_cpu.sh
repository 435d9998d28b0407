#!/bin/sh
# An Inductor cache damaged between two runs of the same compiled step (a node killed while a shared
# cache was written): the first run fills a fresh TORCHINDUCTOR_CACHE_DIR, then each generated
# `<shard>/<key>.py` is cut to half its length, and the step runs again; its output is log 42.
# Usage (repository root): sh tests/realworld/logs/produce/inductor_cache_damage_cpu.sh LOG
set -u
here=$(dirname "$0")
cache=$(mktemp -d)
TORCHINDUCTOR_CACHE_DIR=$cache python3 "$here/inductor_step_cpu.py" >/dev/null 2>&1
find "$cache" -path "$cache/??/c*.py" | while read -r file; do
    truncate -s $(($(stat -c %s "$file") / 2)) "$file"
done
TORCHINDUCTOR_CACHE_DIR=$cache python3 "$here/inductor_step_cpu.py" >"$1" 2>&1
echo "exit $?" >>"$1"
rm -rf "$cache"
