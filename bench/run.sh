#!/usr/bin/env bash
# End-to-end load benchmark: tollgate against nginx, on this machine, in one run.
#
#   bench/run.sh                      # 10 s per row, 32 connections
#   BENCH_DURATION=20 BENCH_CONNECTIONS=64 bench/run.sh
#
# Rows: 1 the upstream directly; 2 nginx proxy_pass (keep-alive pool, 1 worker); 3 nginx with
# limit_req by client address that never rejects; 4 tollgate, memory store, one worker thread,
# three limits (client network, header key, global) that never reject; 5 the same with the
# Redis store (a local redis-server); 6 the refusal path: nginx and tollgate with a limit that
# refuses nearly every request (429 throughput).
# The load generator (wrk) and the upstream run on CPU 0, the proxy on CPU 1: they never share
# a core. Per row: requests/s, p50, p99, the proxy's CPU µs per request (from /proc/PID/stat
# before and after: the figure that stays stable when requests/s swings on a noisy machine),
# its peak RSS, and ratios to rows 1 and 3. Everything started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
LOADGEN_CPU=0
PROXY_CPU=1

missing=()
for tool in wrk nginx redis-server redis-cli taskset; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "bench: missing ${missing[*]}. On Debian: apt-get install wrk nginx-light redis-server redis-tools util-linux" >&2
  exit 1
fi
if (($(nproc) < 2)); then
  echo "bench: needs at least 2 CPUs (the proxy and the load generator must not share one)" >&2
  exit 1
fi

echo "building release binaries..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream

source bench/common.sh

clk_tck=$(getconf CLK_TCK)

# CPU ticks (user + system) of a process and its children-threads.
cpu_ticks() {
  local total=0 pid
  for pid in "$@"; do
    read -r -a stat < "/proc/$pid/stat"
    total=$((total + stat[13] + stat[14]))
  done
  echo "$total"
}

peak_rss_kib() {
  local peak=0 pid value
  for pid in "$@"; do
    value=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status")
    peak=$((value > peak ? value : peak))
  done
  echo "$peak"
}

upstream_port=$(free_port)
taskset -c "$LOADGEN_CPU" ./target/release/examples/fast_upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 &
pids+=($!)
wait_for_port "$upstream_port"

redis_port=$(free_port)
taskset -c "$LOADGEN_CPU" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" >/dev/null 2>&1 &
pids+=($!)
wait_for_port "$redis_port"

results="$work/results"
: > "$results"

# measure NAME URL PID... : runs wrk against URL and records a row for the processes PID...
measure() {
  local name=$1 url=$2
  shift 2
  local before after output rps p50 p99 requests cpu_us rss
  before=$(cpu_ticks "$@")
  output=$(taskset -c "$LOADGEN_CPU" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency \
    -H 'x-user-id: bench-user' "$url")
  after=$(cpu_ticks "$@")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$output")
  requests=$(awk '/requests in/ {print $1}' <<<"$output")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$output")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$output")
  if [[ $# -gt 0 ]]; then
    cpu_us=$(awk -v t=$((after - before)) -v hz="$clk_tck" -v n="$requests" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    rss=$(( $(peak_rss_kib "$@") / 1024 ))
  else
    cpu_us="-"
    rss="-"
  fi
  echo "$name|$rps|$p50|$p99|$cpu_us|$rss" >> "$results"
  measured_requests=$requests
  echo "  $name: $rps requests/s, p50 $p50, p99 $p99, $cpu_us CPU µs/request" >&2
}

# nginx with one worker, pinned to the proxy CPU; prints the PIDs of master and worker.
start_nginx() {
  local name=$1 port=$2 directives=$3 limit_zone=$4
  mkdir -p "$work/$name"
  nginx_conf "$work/$name" "$port" "$upstream_port" "$directives" "$limit_zone" > "$work/$name/nginx.conf"
  taskset -c "$PROXY_CPU" nginx -p "$work/$name" -c "$work/$name/nginx.conf" >/dev/null 2>&1 &
  local master=$!
  pids+=("$master")
  wait_for_port "$port"
  echo "$master $(pgrep -P "$master" | tr '\n' ' ')"
}

# tollgate with one worker thread on the proxy CPU; prints its PID.
start_tollgate() {
  local name=$1 port=$2 store=$3 capacity=$4 rate=$5
  local admin
  admin=$(free_port)
  three_limit_policy "$port" "$admin" "$upstream_port" "$store" "$capacity" "$rate" > "$work/$name.toml"
  RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c "$PROXY_CPU" \
    ./target/release/tollgate --worker-threads 1 run --config "$work/$name.toml" >/dev/null 2>"$work/$name.log" &
  local pid=$!
  pids+=("$pid")
  wait_for_port "$port"
  echo "$pid"
}

stop() {
  local pid
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.3
}

never=1000000000000
redis_store="[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$redis_port\"
timeout = \"1s\""

echo "running $((7 * DURATION)) s of load, ${CONNECTIONS} connections..." >&2
measure "1 upstream directly" "http://127.0.0.1:$upstream_port/"

port=$(free_port); nginx_pids=$(start_nginx proxy "$port" "" "")
measure "2 nginx proxy_pass" "http://127.0.0.1:$port/" $nginx_pids; stop $nginx_pids

port=$(free_port)
nginx_pids=$(start_nginx limit "$port" "$nginx_limit_directives" "$nginx_limit_zone")
measure "3 nginx limit_req" "http://127.0.0.1:$port/" $nginx_pids; stop $nginx_pids

port=$(free_port); pid=$(start_tollgate memory "$port" "" "$never" "1000000000/s")
measure "4 tollgate memory, 3 limits" "http://127.0.0.1:$port/" "$pid"; stop "$pid"

port=$(free_port); pid=$(start_tollgate redis "$port" "$redis_store" "$never" "1000000000/s")
redis-cli -p "$redis_port" config resetstat >/dev/null
measure "5 tollgate redis, 3 limits" "http://127.0.0.1:$port/" "$pid"; stop "$pid"
# Decisions share script calls under load: how many per call, and Redis's CPU per request.
redis_stats=$(redis-cli -p "$redis_port" info commandstats | grep '^cmdstat_evalsha:' || true)
redis_calls=$(grep -o 'calls=[0-9]*' <<<"$redis_stats" | head -1 | cut -d= -f2)
redis_usec=$(grep -o 'usec=[0-9]*' <<<"$redis_stats" | head -1 | cut -d= -f2)
redis_summary=$(awk -v calls="${redis_calls:-0}" -v usec="${redis_usec:-0}" -v n="$measured_requests" \
  'BEGIN {if (calls > 0) printf "row 5: %.1f requests per Redis script call, %.2f µs of Redis CPU per request", n / calls, usec / n}')

port=$(free_port)
nginx_pids=$(start_nginx refuse "$port" "$nginx_refuse_directives" "$nginx_refuse_zone")
measure "6a nginx refusing (429)" "http://127.0.0.1:$port/" $nginx_pids; stop $nginx_pids

port=$(free_port); pid=$(start_tollgate refuse "$port" "" 1 "1/h")
measure "6b tollgate refusing (429)" "http://127.0.0.1:$port/" "$pid"; stop "$pid"

python3 - "$results" <<'PY'
import sys
rows = [line.rstrip("\n").split("|") for line in open(sys.argv[1])]
def ms(text):
    value, unit = float(text[:-2] if text.endswith(("us", "ms")) else text[:-1]), text[-2:]
    return value / 1000 if unit == "us" else value * 1000 if not text.endswith("ms") else value
base1, base3 = float(rows[0][1]), float(rows[2][1])
cpu3 = float(rows[2][4])
print(f"\n| row | requests/s | p50 | p99 | proxy CPU µs/req | peak RSS MiB | rps ÷ row 1 | rps ÷ row 3 | CPU ÷ row 3 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, rps, p50, p99, cpu, rss in rows:
    cpu_ratio = f"{float(cpu) / cpu3:.2f}" if cpu != "-" else "-"
    print(f"| {name} | {float(rps):,.0f} | {p50} | {p99} | {cpu} | {rss} | {float(rps) / base1:.2f} | {float(rps) / base3:.2f} | {cpu_ratio} |")
PY
echo
echo "$redis_summary"
