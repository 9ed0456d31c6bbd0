#!/usr/bin/env bash
# End-to-end load benchmark: tollgate against nginx, on this machine, in one run.
#
#   bench/run.sh                      # 3 rounds of 10 s per row, 32 connections
#   BENCH_DURATION=20 BENCH_CONNECTIONS=64 BENCH_ROUNDS=5 bench/run.sh
#
# Rows: 1 the upstream directly; 2 nginx proxy_pass (keep-alive pool, 1 worker); 3 nginx with
# limit_req by client address that never rejects; 4 tollgate, memory store, one worker thread,
# three limits (client network, header key, global) that never reject; 5 the same with the
# Redis store (a local redis-server); 5b the same with the global limit leased (`lease`, each
# replica takes its tokens in batches); 6 the refusal path: nginx and tollgate with a limit that
# refuses nearly every request (429 throughput).
# The load generator (wrk) and the upstream run on CPU 0, the proxy on CPU 1: they never share
# a core. Per row: requests/s, p50, p99, the proxy's CPU µs per request (from /proc/PID/stat
# before and after: the figure that stays stable when requests/s swings on a noisy machine)
# and how much of it the kernel spent on the proxy's behalf (system time), its peak RSS, and
# ratios to rows 1 and 3; per round, the share of the machine's time its hypervisor stole, and
# how busy CPU 0 was (wrk, the upstream and Redis share it: a row that keeps it busy is bounded
# there, not by the proxy). The
# rows run in rounds, one after the other, and the table gives each row's median over the
# rounds: on a shared machine a neighbour's burst then lands in one round of one row, not in
# the whole of it. Everything started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
ROUNDS=${BENCH_ROUNDS:-3}
for setting in "BENCH_DURATION=$DURATION" "BENCH_CONNECTIONS=$CONNECTIONS" "BENCH_ROUNDS=$ROUNDS"; do
  if [[ ! "${setting#*=}" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench: $setting is not a whole number of at least 1" >&2
    exit 1
  fi
done
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

# CPU ticks of processes (with their threads): user and system (the kernel's, on their behalf).
cpu_ticks() {
  local user=0 system=0 pid
  for pid in "$@"; do
    read -r -a stat < "/proc/$pid/stat"
    user=$((user + stat[13]))
    system=$((system + stat[14]))
  done
  echo "$user $system"
}

# The machine's steal and total ticks (all CPUs): time the hypervisor gave to other guests.
steal_ticks() {
  awk '$1 == "cpu" {print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat
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

start_redis taskset -c "$LOADGEN_CPU"

results="$work/results"
: > "$results"

# measure NAME URL PID... : runs wrk against URL and records a row for the processes PID...
measure() {
  local name=$1 url=$2
  shift 2
  local user_before system_before user_after system_after output rps p50 p99 requests cpu_us
  local kernel_us rss
  local steal_before ticks_before steal_after ticks_after steal
  local loadgen_before loadgen_ticks_before loadgen_after loadgen_ticks_after loadgen_busy
  read -r user_before system_before < <(cpu_ticks "$@")
  read -r steal_before ticks_before < <(steal_ticks)
  read -r loadgen_before loadgen_ticks_before < <(busy_ticks "$LOADGEN_CPU")
  output=$(taskset -c "$LOADGEN_CPU" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency \
    -H 'x-user-id: bench-user' "$url")
  read -r user_after system_after < <(cpu_ticks "$@")
  read -r steal_after ticks_after < <(steal_ticks)
  read -r loadgen_after loadgen_ticks_after < <(busy_ticks "$LOADGEN_CPU")
  loadgen_busy=$(awk -v b=$((loadgen_after - loadgen_before)) \
    -v t=$((loadgen_ticks_after - loadgen_ticks_before)) 'BEGIN {printf "%.0f", (t > 0 ? 100 * b / t : 0)}')
  steal=$(awk -v s=$((steal_after - steal_before)) -v t=$((ticks_after - ticks_before)) \
    'BEGIN {printf "%.0f", (t > 0 ? 100 * s / t : 0)}')
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$output")
  requests=$(awk '/requests in/ {print $1}' <<<"$output")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$output")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$output")
  if [[ $# -gt 0 ]]; then
    local user=$((user_after - user_before)) system=$((system_after - system_before))
    cpu_us=$(awk -v t=$((user + system)) -v hz="$clk_tck" -v n="$requests" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    kernel_us=$(awk -v t="$system" -v hz="$clk_tck" -v n="$requests" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    rss=$(( $(peak_rss_kib "$@") / 1024 ))
  else
    cpu_us="-"
    kernel_us="-"
    rss="-"
  fi
  echo "$name|$rps|$p50|$p99|$cpu_us|$kernel_us|$rss|$steal|$loadgen_busy" >> "$results"
  measured_requests=$requests
  echo "  $name: $rps requests/s, p50 $p50, p99 $p99, $cpu_us CPU µs/request ($kernel_us in the kernel), steal $steal %, CPU $LOADGEN_CPU busy $loadgen_busy %" >&2
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
  local name=$1 port=$2 store=$3 capacity=$4 rate=$5 global_extra=${6:-}
  local admin
  admin=$(free_port)
  three_limit_policy "$port" "$admin" "$upstream_port" "$store" "$capacity" "$rate" "$global_extra" > "$work/$name.toml"
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

echo "running $((8 * DURATION * ROUNDS)) s of load: $ROUNDS rounds, ${CONNECTIONS} connections..." >&2
redis_calls=0 redis_usec=0 redis_requests=0
leased_calls=0 leased_usec=0 leased_requests=0

# Redis's script calls and their CPU µs since the last reset, from INFO commandstats.
script_stats() {
  local stats calls usec
  stats=$(redis-cli -p "$redis_port" info commandstats | grep -E '^cmdstat_(evalsha|eval):' || true)
  calls=$(grep -o 'calls=[0-9]*' <<<"$stats" | cut -d= -f2 | paste -sd+ | bc)
  usec=$(grep -o 'usec=[0-9]*' <<<"$stats" | cut -d= -f2 | paste -sd+ | bc)
  echo "${calls:-0} ${usec:-0}"
}
for round in $(seq "$ROUNDS"); do
echo " round $round of $ROUNDS" >&2
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
read -r calls usec < <(script_stats)
redis_calls=$((redis_calls + calls))
redis_usec=$((redis_usec + usec))
redis_requests=$((redis_requests + measured_requests))

port=$(free_port)
pid=$(start_tollgate leased "$port" "$redis_store" "$never" "1000000000/s" 'lease = "20ms"')
redis-cli -p "$redis_port" config resetstat >/dev/null
measure "5b tollgate redis, global leased" "http://127.0.0.1:$port/" "$pid"; stop "$pid"
read -r calls usec < <(script_stats)
leased_calls=$((leased_calls + calls))
leased_usec=$((leased_usec + usec))
leased_requests=$((leased_requests + measured_requests))

port=$(free_port)
nginx_pids=$(start_nginx refuse "$port" "$nginx_refuse_directives" "$nginx_refuse_zone")
measure "6a nginx refusing (429)" "http://127.0.0.1:$port/" $nginx_pids; stop $nginx_pids

port=$(free_port); pid=$(start_tollgate refuse "$port" "" 1 "1/h")
measure "6b tollgate refusing (429)" "http://127.0.0.1:$port/" "$pid"; stop "$pid"
done
redis_summary=$(awk -v calls="$redis_calls" -v usec="$redis_usec" -v n="$redis_requests" \
  -v lcalls="$leased_calls" -v lusec="$leased_usec" -v ln="$leased_requests" \
  'BEGIN {if (calls > 0) printf "row 5: %.1f requests per Redis script call, %.2f µs of Redis CPU per request\n", n / calls, usec / n;
          if (lcalls > 0) printf "row 5b: %.1f requests per Redis script call, %.2f µs of Redis CPU per request", ln / lcalls, lusec / ln}')

python3 - "$results" <<'PY'
import statistics
import sys

def microseconds(text):
    """wrk's latency ("283.00us", "1.42ms", "1.05s") in µs."""
    for unit, factor in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)

def latency(us):
    return f"{us:.0f} µs" if us < 1000 else f"{us / 1000:.2f} ms"

# Every round's measurement of each row, the rows in their order.
rounds = {}
for line in open(sys.argv[1]):
    name, rps, p50, p99, cpu, kernel, rss, steal, loadgen_busy = line.rstrip("\n").split("|")
    rounds.setdefault(name, []).append(
        (float(rps), microseconds(p50), microseconds(p99), None if cpu == "-" else float(cpu),
         None if kernel == "-" else float(kernel), None if rss == "-" else int(rss), int(steal),
         int(loadgen_busy)))
names = list(rounds)
median = {name: [statistics.median(m[i] for m in rounds[name]) if rounds[name][0][i] is not None
                 else None for i in range(5)] for name in names}
peak = {name: max((m[5] for m in rounds[name] if m[5] is not None), default=None) for name in names}
base1, base3 = median[names[0]][0], median[names[2]][0]
cpu3 = median[names[2]][3]
count = len(rounds[names[0]])
print(f"\nmedians of {count} round(s)\n")
print("| row | requests/s | p50 | p99 | proxy CPU µs/req | of it kernel | peak RSS MiB | rps ÷ row 1 | rps ÷ row 3 | CPU ÷ row 3 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name in names:
    rps, p50, p99, cpu, kernel = median[name]
    cpu_text = "-" if cpu is None else f"{cpu:.2f}"
    kernel_text = "-" if kernel is None else f"{kernel:.2f}"
    cpu_ratio = "-" if cpu is None else f"{cpu / cpu3:.2f}"
    rss = "-" if peak[name] is None else peak[name]
    print(f"| {name} | {rps:,.0f} | {latency(p50)} | {latency(p99)} | {cpu_text} | {kernel_text} "
          f"| {rss} | {rps / base1:.2f} | {rps / base3:.2f} | {cpu_ratio} |")

# Ratios between rows measured in the same round, one per round: the comparisons that a
# burst on the machine moves least.
def per_round(numerator, denominator, field, denominator_field=None):
    pairs = zip(rounds[names[numerator]], rounds[names[denominator]])
    below = field if denominator_field is None else denominator_field
    return " ".join(f"{a[field] / b[below]:.2f}" for a, b in pairs)
print("\nper round:")
print(f"  row 4 ÷ row 3, CPU per request: {per_round(3, 2, 3)}; requests/s: {per_round(3, 2, 0)}; p99: {per_round(3, 2, 2)}")
# The kernel's share of tollgate's CPU, in units of nginx's whole: the ratio row 4 ÷ row 3
# would have if tollgate's own code cost nothing.
print(f"  row 4's kernel time ÷ row 3's CPU: {per_round(3, 2, 4, 3)}")
print(f"  6b ÷ 6a (429s), CPU per request: {per_round(7, 6, 3)}; requests/s: {per_round(7, 6, 0)}")
print(f"  row 5 ÷ row 4, requests/s: {per_round(4, 3, 0)}")
print(f"  row 5b ÷ row 4, requests/s: {per_round(5, 3, 0)}")
# On a virtual machine the hypervisor may run other guests on its CPUs: a round where it did
# measures the host, not the proxies.
print("  steal, % of the machine's CPU time, rows in order:")
for index in range(count):
    print(f"    round {index + 1}: " + " ".join(str(rounds[name][index][6]) for name in names))
# CPU 0 runs wrk and the upstream, and in rows 5 and 5b Redis too: a row where it is busy all
# the time is bounded there, not by the proxy on CPU 1.
print("  CPU 0 (load generator, upstream, Redis) busy, %, rows in order:")
for index in range(count):
    print(f"    round {index + 1}: " + " ".join(str(rounds[name][index][7]) for name in names))
PY
echo
echo "$redis_summary"
