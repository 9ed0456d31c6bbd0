#!/usr/bin/env bash
# A/B of two tollgate builds in one run: row 4 (memory store, three limits that never reject)
# and row 6b (every request refused, 429) of bench/run.sh, for build A and build B, in
# interleaved rounds on the same machine, so that a change is judged against the code before
# it as measured in the same minutes.
#
#   bench/ab.sh BASELINE_BINARY                  # A = BASELINE_BINARY, B = ./target/release/tollgate
#   BENCH_DURATION=8 BENCH_ROUNDS=5 bench/ab.sh /tmp/before/target/release/tollgate
#   STORE=redis bench/ab.sh BASELINE_BINARY      # rows 4 and 5 (the Redis store, a private
#                                                # redis-server on CPU 0) instead of 4 and 6b
#   CLOSE=1 bench/ab.sh BASELINE_BINARY          # rows 6b and 6c: every request refused, on
#                                                # keep-alive connections and on a connection each
#
# Per row and build: the median over the rounds of requests/s and the gateway's CPU µs per
# request (user + system from /proc/PID/stat), then B ÷ A per round and its median (with
# STORE=redis, also each build's row 5 ÷ row 4 in requests/s, per round). Load
# generator and upstream on CPU 0, the gateway on CPU 1, as in bench/run.sh. Everything
# started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

baseline=${1:?usage: bench/ab.sh BASELINE_BINARY}
[[ -x "$baseline" ]] || { echo "bench: $baseline is not an executable" >&2; exit 1; }
DURATION=${BENCH_DURATION:-8}
ROUNDS=${BENCH_ROUNDS:-3}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
source bench/common.sh
whole_numbers "BENCH_DURATION=$DURATION" "BENCH_ROUNDS=$ROUNDS" "BENCH_CONNECTIONS=$CONNECTIONS"
need_tools wrk taskset python3

echo "building the release binary..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream

start_fast_upstream

rows=("4:1000000000000:1000000000/s" "6b:1:1/h")
redis_section=""
if [[ "${STORE:-memory}" == redis ]]; then
  need_tools redis-server redis-cli
  start_redis
  redis_section="[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$redis_port\""
  rows=("4:1000000000000:1000000000/s" "5:1000000000000:1000000000/s")
elif [[ -n "${CLOSE:-}" ]]; then
  rows=("6b:1:1/h" "6c:1:1/h")
fi

# run BINARY CAPACITY RATE ROW: one gateway, one wrk run; prints "requests/s cpu_us".
run() {
  local port admin store=""
  port=$(free_port)
  admin=$(free_port)
  [[ $4 == 5 ]] && store=$redis_section
  three_limit_policy "$port" "$admin" "$upstream_port" "$store" "$2" "$3" > "$work/policy.toml"
  if [[ $4 == 5 ]]; then
    ALSO_PID=$redis_pid measure_gateway "$1" "$work/policy.toml" "$port" -H 'x-user-id: bench-user'
  elif [[ $4 == 6c ]]; then
    measure_gateway "$1" "$work/policy.toml" "$port" -H 'x-user-id: bench-user' \
      -H 'Connection: close'
  else
    measure_gateway "$1" "$work/policy.toml" "$port" -H 'x-user-id: bench-user'
  fi
}

: > "$work/ab"
for round in $(seq 1 "$ROUNDS"); do
  for row in "${rows[@]}"; do
    IFS=: read -r name capacity rate <<<"$row"
    for build in A B; do
      binary=$baseline
      [[ $build == B ]] && binary=./target/release/tollgate
      result=$(run "$binary" "$capacity" "$rate" "$name")
      echo "$round $name $build $result" | tee -a "$work/ab" >&2
    done
  done
done

python3 - "$work/ab" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    round_, name, build, rps, cpu, *redis = line.split()
    rows.setdefault(name, {}).setdefault(build, []).append(
        (int(round_), float(rps), float(cpu), *map(float, redis)))
print("| row | A requests/s | B requests/s | A CPU µs/req | B CPU µs/req | B ÷ A CPU (per round) | B ÷ A CPU, median |")
print("|---|---:|---:|---:|---:|---|---:|")
for name, builds in rows.items():
    a, b = builds["A"], builds["B"]
    ratios = [bb[2] / aa[2] for aa, bb in zip(a, b)]
    print(f"| {name} | {statistics.median(x[1] for x in a):,.0f} | {statistics.median(x[1] for x in b):,.0f} "
          f"| {statistics.median(x[2] for x in a):.2f} | {statistics.median(x[2] for x in b):.2f} "
          f"| {', '.join(f'{r:.3f}' for r in ratios)} | {statistics.median(ratios):.3f} |")
if "5" in rows:
    for build in "AB":
        ratios = [five[1] / four[1] for four, five in zip(rows["4"][build], rows["5"][build])]
        redis_cpu = statistics.median(five[3] for five in rows["5"][build])
        print(f"{build}: row 5 ÷ row 4, requests/s: {', '.join(f'{r:.2f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.2f}); Redis CPU µs per request, median "
              f"{redis_cpu:.2f}")
PY
