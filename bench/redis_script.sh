#!/usr/bin/env bash
# Redis's own cost per decision: the store's decide script (src/limit/decide.lua) called for
# three-bucket requests by redis-benchmark against a private redis-server.
#
#   bench/redis_script.sh                    # µs of Redis CPU per decision (INFO
#                                            # commandstats), redis-server alone on CPU 1
#   bench/redis_script.sh path/to/other.lua  # a variant, for comparison in the same run
#   BATCH=8 bench/redis_script.sh            # 8 requests on the same buckets per call, as
#                                            # the gateway batches them under load
#   BUCKETS=1 bench/redis_script.sh          # one-bucket decisions (1 to 3; default 3)
#   INSTRUCTIONS=1 bench/redis_script.sh     # redis-server's instructions per call, counted by
#                                            # callgrind: steady where the µs swing with the
#                                            # machine's load
set -euo pipefail
cd "$(dirname "$0")/.."

tools=(redis-server redis-cli redis-benchmark taskset python3)
[[ -n "${INSTRUCTIONS:-}" ]] && tools+=(valgrind callgrind_annotate)
for tool in "${tools[@]}"; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench: missing $tool. On Debian: apt-get install redis-server redis-tools util-linux python3 valgrind" >&2
    exit 1
  fi
done

source bench/common.sh

script=${1:-src/limit/decide.lua}
# Per bucket: capacity, rate, cost, enforce, adaptive factor (0: none), adaptive minimum.
bucket="1000000000000 1000000000 1 1 0 0"
batch=${BATCH:-1}
buckets=${BUCKETS:-3}
if [[ ! "$buckets" =~ ^[1-3]$ ]]; then
  echo "bench: BUCKETS=$buckets: 1, 2 or 3" >&2
  exit 1
fi
keys=('{bench}per_network:v4:127.0.0.1/32' '{bench}per_user:h:0fa000000000000000000000000000ff'
  '{bench}everyone:global')
keys=("${keys[@]:0:$buckets}")
# The deadline (0: none), one shape of the buckets, then per request: its shape and its keys.
arguments=(0 1 "$buckets")
for ((index = 1; index <= buckets; index++)); do
  # shellcheck disable=SC2206 # the bucket's numbers are separate arguments
  arguments+=($bucket)
done
for ((request = 0; request < batch; request++)); do
  arguments+=(1 $(seq -s ' ' 1 "$buckets"))
done

# start_redis [WRAPPER...]: a private redis-server on a free port; sets $port and $redis.
start_redis() {
  port=$(free_port)
  "$@" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" >/dev/null 2>&1 &
  redis=$!
  pids+=("$redis")
  wait_for_port "$port"
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
}

# calls N: N calls of BATCH decisions of BUCKETS buckets each, from redis-benchmark on CPU 0.
calls() {
  local sha
  sha=$(redis-cli -p "$port" script load "$(cat "$script")")
  taskset -c 0 redis-benchmark -p "$port" -c 8 -n "$1" -q evalsha "$sha" "${#keys[@]}" \
    "${keys[@]}" "${arguments[@]}" >/dev/null
}

if [[ -z "${INSTRUCTIONS:-}" ]]; then
  start_redis taskset -c 1
  calls 200000
  stats=$(redis-cli -p "$port" info commandstats | grep '^cmdstat_evalsha:')
  per_call=$(grep -o 'usec_per_call=[0-9.]*' <<<"$stats" | cut -d= -f2)
  echo "$script: $(python3 -c "print(f'{$per_call / $batch:.2f}')") µs of Redis CPU per $buckets-bucket decision ($batch per call)"
  exit 0
fi

# Instructions of a whole redis-server run with N calls; the difference of two runs leaves out
# start-up and shutdown.
instructions() {
  local out="$work/callgrind.$1"
  start_redis valgrind --tool=callgrind --callgrind-out-file="$out"
  calls "$1"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$redis" || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !seen {gsub(",", "", $1); print $1; seen = 1}'
}
few=$(instructions 1000)
many=$(instructions 11000)
echo "$script: $(((many - few) / 10000 / batch)) redis-server instructions per $buckets-bucket decision ($batch per call)"
