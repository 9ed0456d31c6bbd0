#!/usr/bin/env bash
# A/B of two tollgate builds in one run: row 4 (memory store, three limits that never reject)
# and row 6b (every request refused, 429) of bench/run.sh, for build A and build B, in
# interleaved rounds on the same machine, so that a change is judged against the code before
# it as measured in the same minutes.
#
#   bench/ab.sh BASELINE_BINARY                  # A = BASELINE_BINARY, B = ./target/release/tollgate
#   BENCH_DURATION=8 BENCH_ROUNDS=5 bench/ab.sh /tmp/before/target/release/tollgate
#
# Per row and build: the median over the rounds of requests/s and the gateway's CPU µs per
# request (user + system from /proc/PID/stat), then B ÷ A per round and its median. Load
# generator and upstream on CPU 0, the gateway on CPU 1, as in bench/run.sh. Everything
# started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

baseline=${1:?usage: bench/ab.sh BASELINE_BINARY}
[[ -x "$baseline" ]] || { echo "bench: $baseline is not an executable" >&2; exit 1; }
DURATION=${BENCH_DURATION:-8}
ROUNDS=${BENCH_ROUNDS:-3}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
for setting in "BENCH_DURATION=$DURATION" "BENCH_ROUNDS=$ROUNDS" "BENCH_CONNECTIONS=$CONNECTIONS"; do
  if [[ ! "${setting#*=}" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench: $setting is not a whole number of at least 1" >&2
    exit 1
  fi
done
for tool in wrk taskset python3; do
  command -v "$tool" >/dev/null || { echo "bench: missing $tool (apt-get install wrk util-linux python3)" >&2; exit 1; }
done

echo "building the release binary..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream
source bench/common.sh
clk_tck=$(getconf CLK_TCK)

upstream_port=$(free_port)
taskset -c 0 ./target/release/examples/fast_upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 &
pids+=($!)
wait_for_port "$upstream_port"

# run BINARY CAPACITY RATE: one gateway, one wrk run; prints "requests/s cpu_us".
run() {
  local binary=$1 port admin pid before after output requests rps
  port=$(free_port)
  admin=$(free_port)
  three_limit_policy "$port" "$admin" "$upstream_port" "" "$2" "$3" > "$work/policy.toml"
  RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 \
    "$binary" --worker-threads 1 run --config "$work/policy.toml" >/dev/null 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_for_port "$port"
  taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d2s -H 'x-user-id: bench-user' "http://127.0.0.1:$port/" >/dev/null
  read -r -a stat < "/proc/$pid/stat"
  before=$((stat[13] + stat[14]))
  output=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" -H 'x-user-id: bench-user' "http://127.0.0.1:$port/")
  read -r -a stat < "/proc/$pid/stat"
  after=$((stat[13] + stat[14]))
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  requests=$(awk '/requests in/ {print $1}' <<<"$output")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$output")
  awk -v r="$rps" -v t=$((after - before)) -v hz="$clk_tck" -v n="$requests" \
    'BEGIN {printf "%s %.3f\n", r, t * 1e6 / hz / n}'
}

: > "$work/ab"
for round in $(seq 1 "$ROUNDS"); do
  for row in "4:1000000000000:1000000000/s" "6b:1:1/h"; do
    IFS=: read -r name capacity rate <<<"$row"
    for build in A B; do
      binary=$baseline
      [[ $build == B ]] && binary=./target/release/tollgate
      result=$(run "$binary" "$capacity" "$rate")
      echo "$round $name $build $result" | tee -a "$work/ab" >&2
    done
  done
done

python3 - "$work/ab" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    round_, name, build, rps, cpu = line.split()
    rows.setdefault(name, {}).setdefault(build, []).append((int(round_), float(rps), float(cpu)))
print("| row | A requests/s | B requests/s | A CPU µs/req | B CPU µs/req | B ÷ A CPU (per round) | B ÷ A CPU, median |")
print("|---|---:|---:|---:|---:|---|---:|")
for name, builds in rows.items():
    a, b = builds["A"], builds["B"]
    ratios = [bb[2] / aa[2] for aa, bb in zip(a, b)]
    print(f"| {name} | {statistics.median(x[1] for x in a):,.0f} | {statistics.median(x[1] for x in b):,.0f} "
          f"| {statistics.median(x[2] for x in a):.2f} | {statistics.median(x[2] for x in b):.2f} "
          f"| {', '.join(f'{r:.3f}' for r in ratios)} | {statistics.median(ratios):.3f} |")
PY
