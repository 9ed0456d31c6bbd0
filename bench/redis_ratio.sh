#!/usr/bin/env bash
# The Redis store's throughput beside the memory store's at the same concurrency, in two
# placements, their rounds interleaved:
#
#   shared  as bench/run.sh's rows 4 and 5: the gateway alone on CPU 1, and wrk, the upstream
#           and redis-server together on CPU 0. The memory row already keeps CPU 0 busy, so
#           every microsecond Redis spends there comes out of the Redis row's throughput: on a
#           2-core machine this placement measures Redis's own CPU as much as the gateway.
#   bound   the same processes, with the gateway held to CAP % of CPU 1 by a CPU cgroup, so
#           that the gateway is the bound and CPU 0 has room, as when the load and Redis run
#           on machines of their own. Here the ratio is what the Redis store costs the gateway.
#
#   bench/redis_ratio.sh                           # 5 rounds of 5 s, 32 connections, CAP=50
#   BENCH_ROUNDS=7 BENCH_DURATION=10 CAP=40 bench/redis_ratio.sh
#
# Each row: requests/s, the gateway's CPU µs per request, Redis's (the whole process: its
# script and its socket), and how busy CPU 0 was. The bound rows need a writable CPU cgroup
# (v2's cpu.max or v1's cfs quota, as root); without one they are skipped, and said so.
# Everything started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-5}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
ROUNDS=${BENCH_ROUNDS:-5}
CAP=${CAP:-50}
source bench/common.sh
whole_numbers "BENCH_DURATION=$DURATION" "BENCH_CONNECTIONS=$CONNECTIONS" \
  "BENCH_ROUNDS=$ROUNDS" "CAP=$CAP"
need_tools wrk taskset python3 redis-server redis-cli curl
if ((CAP >= 100)); then
  echo "bench: CAP is a share of one CPU below 100 (%), not $CAP" >&2
  exit 1
fi

cargo build --release --quiet --bin tollgate --example fast_upstream
start_fast_upstream

start_redis

# A CPU cgroup for the gateway of the bound rows: 10 ms periods, so that a held gateway
# pauses for milliseconds at a time, well inside the store's timeout.
cgroup=""
period_us=10000
quota_us=$((period_us * CAP / 100))
if [[ -w /sys/fs/cgroup/cgroup.subtree_control ]] &&
  grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control &&
  mkdir "/sys/fs/cgroup/tollgate-bench-$$" 2>/dev/null; then
  cgroup="/sys/fs/cgroup/tollgate-bench-$$"
  echo "$quota_us $period_us" > "$cgroup/cpu.max"
elif mkdir "/sys/fs/cgroup/cpu/tollgate-bench-$$" 2>/dev/null; then
  cgroup="/sys/fs/cgroup/cpu/tollgate-bench-$$"
  echo "$period_us" > "$cgroup/cpu.cfs_period_us"
  echo "$quota_us" > "$cgroup/cpu.cfs_quota_us"
else
  echo "bench: no writable CPU cgroup here (run as root on cgroup v1 or v2 with the cpu" \
    "controller): the bound rows are skipped" >&2
fi
trap 'cleanup; [[ -n "$cgroup" ]] && rmdir "$cgroup" 2>/dev/null; true' EXIT

never=1000000000000
admin_port=$(free_port)
policy() {
  local store=$1 port
  port=$(free_port)
  three_limit_policy "$port" "$admin_port" "$upstream_port" "$store" "$never" "1000000000/s" \
    > "$work/policy.toml"
  echo "$port"
}
redis_store="[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$redis_port\"
timeout = \"1s\""

# row NAME STORE_SECTION PLACEMENT: one row's measurement appended to $work/rows.
row() {
  local name=$1 store=$2 placement=$3 port redis_before cpu0_before cpu0_ticks_before
  local cpu0_after cpu0_ticks_after measured per_call
  port=$(policy "$store")
  start_gateway "$work/policy.toml" "$port"
  [[ "$placement" == bound ]] && echo "$gateway" > "$cgroup/cgroup.procs"
  # Warmed up first: connections to the upstream and to Redis made, buckets in place.
  taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d1s -H 'x-user-id: bench-user' \
    "http://127.0.0.1:$port/" >/dev/null
  redis_before=$(cpu_ticks "$redis_pid")
  read -r cpu0_before cpu0_ticks_before < <(busy_ticks 0)
  measured=$(gateway_row "http://127.0.0.1:$port/" -H 'x-user-id: bench-user')
  read -r cpu0_after cpu0_ticks_after < <(busy_ticks 0)
  # Requests per store call, warm-up included: how well decisions batched.
  per_call=$(curl -s "http://127.0.0.1:$admin_port/metrics" | awk '
    /^tollgate_store_batch_requests_sum/ {sum += $2} /^tollgate_store_batch_requests_count/ {n += $2}
    END {if (n > 0) printf "%.1f", sum / n; else print "-"}')
  awk -v row="$name" -v placement="$placement" -v m="$measured" -v per_call="$per_call" \
    -v redis=$(($(cpu_ticks "$redis_pid") - redis_before)) -v hz="$(getconf CLK_TCK)" -v d="$DURATION" \
    -v busy=$((cpu0_after - cpu0_before)) -v ticks=$((cpu0_ticks_after - cpu0_ticks_before)) \
    'BEGIN {split(m, f, " "); n = f[1] * d;
            printf "%s|%s|%s|%s|%.3f|%.0f|%s\n", row, placement, f[1], f[2], redis * 1e6 / hz / n,
              100 * busy / ticks, per_call}' >> "$work/rows"
  echo "  $name, $placement: $(tail -n 1 "$work/rows" | cut -d'|' -f3-)" >&2
  kill "$gateway" 2>/dev/null || true
  wait "$gateway" 2>/dev/null || true
}

placements=(shared)
[[ -n "$cgroup" ]] && placements+=(bound)
echo "rounds: $ROUNDS of ${DURATION} s per row, $CONNECTIONS connections; the bound rows' gateway held to $CAP % of CPU 1" >&2
: > "$work/rows"
for round in $(seq "$ROUNDS"); do
  echo " round $round of $ROUNDS (requests/s | gateway µs/req | Redis µs/req | CPU 0 busy % | requests per store call)" >&2
  for placement in "${placements[@]}"; do
    row memory "" "$placement"
    row redis "$redis_store" "$placement"
  done
done

python3 - "$work/rows" <<'PY'
import statistics
import sys

rows = {}
for line in open(sys.argv[1]):
    store, placement, rps, gateway_us, redis_us, busy, per_call = line.rstrip("\n").split("|")
    rows.setdefault((placement, store), []).append(
        (float(rps), float(gateway_us), float(redis_us), float(busy),
         float(per_call) if per_call != "-" else 0.0))
print("\n| placement | store | requests/s | gateway CPU µs/req | Redis CPU µs/req | CPU 0 busy "
      "| requests per Redis call |")
print("|---|---|---:|---:|---:|---:|---:|")
for (placement, store), measured in rows.items():
    rps, gateway_us, redis_us, busy, per_call = (
        statistics.median(m[i] for m in measured) for i in range(5))
    redis_text = f"{redis_us:.2f}" if store == "redis" else "-"
    per_call_text = f"{per_call:.1f}" if store == "redis" else "-"
    print(f"| {placement} | {store} | {rps:,.0f} | {gateway_us:.2f} | {redis_text} | {busy:.0f} % "
          f"| {per_call_text} |")
print()
for placement in ("shared", "bound"):
    if (placement, "redis") not in rows:
        continue
    pairs = list(zip(rows[(placement, "redis")], rows[(placement, "memory")]))
    throughput = [redis[0] / memory[0] for redis, memory in pairs]
    cpu = [memory[1] / redis[1] for redis, memory in pairs]
    print(f"{placement}: Redis ÷ memory, requests/s per round "
          + " ".join(f"{ratio:.2f}" for ratio in throughput)
          + f" (median {statistics.median(throughput):.2f}); gateway CPU per request, memory ÷ Redis,"
          + f" median {statistics.median(cpu):.2f}")
PY
