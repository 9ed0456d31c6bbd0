#!/usr/bin/env bash
# Redis's own CPU per decision: the store's decide script (src/limit/decide.lua) called for
# three buckets by redis-benchmark, with a private redis-server alone on CPU 1. Prints
# microseconds per call, as Redis counts them (INFO commandstats).
#
#   bench/redis_script.sh                    # the shipped script
#   bench/redis_script.sh path/to/other.lua  # a variant, for comparison in the same run
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server redis-cli redis-benchmark taskset python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench: missing $tool. On Debian: apt-get install redis-server redis-tools util-linux python3" >&2
    exit 1
  fi
done

source bench/common.sh

script=${1:-src/limit/decide.lua}
port=$(free_port)
taskset -c 1 redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" >/dev/null 2>&1 &
pids+=($!)
wait_for_port "$port"

sha=$(redis-cli -p "$port" script load "$(cat "$script")")
# Per bucket: capacity, rate, cost, enforce, adaptive factor (0: none), adaptive minimum.
bucket="1000000000000 1000000000 1 1 0 0"
# shellcheck disable=SC2086 # the buckets' numbers are separate arguments
taskset -c 0 redis-benchmark -p "$port" -c 8 -n 200000 -q evalsha "$sha" 3 \
  '{bench}per_network:v4:127.0.0.1/32' '{bench}per_user:h:0fa000000000000000000000000000ff' \
  '{bench}everyone:global' $bucket $bucket $bucket >/dev/null
calls=$(redis-cli -p "$port" info commandstats | grep '^cmdstat_evalsha:')
echo "$script: $(grep -o 'usec_per_call=[0-9.]*' <<<"$calls" | cut -d= -f2) µs of Redis CPU per three-bucket call"
