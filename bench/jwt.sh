#!/usr/bin/env bash
# A three-limit route whose per-user limit is keyed by a verified JWT claim, against the same
# route keyed by a header, in one run: what verifying (and caching) the token costs per request.
#
#   bench/jwt.sh                      # 3 rounds of 10 s per row, 32 connections
#   BENCH_DURATION=20 BENCH_ROUNDS=5 bench/jwt.sh
#
# Every request carries the same RS256 token (a client reuses its token), so after the first
# one it is found in the cache. The load generator (wrk) and the upstream run on CPU 0,
# tollgate (one worker thread) on CPU 1. Per row: requests/s and tollgate's CPU µs per request
# (from /proc/PID/stat), the median over rounds, and the JWT row over the header row per round.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
ROUNDS=${BENCH_ROUNDS:-3}
for tool in wrk taskset; do
  command -v "$tool" >/dev/null || { echo "bench: missing $tool (apt-get install wrk util-linux)" >&2; exit 1; }
done

echo "building release binaries..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream --example sign_token

source bench/common.sh

clk_tck=$(getconf CLK_TCK)
upstream_port=$(free_port)
taskset -c 0 ./target/release/examples/fast_upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 &
pids+=($!)
wait_for_port "$upstream_port"
token=$(./target/release/examples/sign_token "$work/jwks.json")

never=1000000000000
# policy NAME KEY_TOML [AUTH_TOML]: the three-limit policy with per_user keyed as given.
policy() {
  three_limit_policy "$2" "$(free_port)" "$upstream_port" "${4:-}" "$never" "1000000000/s" \
    | sed "s|key = { header = \"x-user-id\" }|key = $3|" > "$work/$1.toml"
}

results="$work/results"
: > "$results"
for round in $(seq "$ROUNDS"); do
  echo " round $round of $ROUNDS" >&2
  for row in header jwt; do
    port=$(free_port)
    if [[ $row == header ]]; then
      policy header "$port" '{ header = "x-user-id" }'
    else
      policy jwt "$port" '{ jwt_claim = "sub" }' "[auth.jwt]
jwks_file = \"$work/jwks.json\""
    fi
    RUST_LOG=warn taskset -c 1 ./target/release/tollgate --worker-threads 1 run --config "$work/$row.toml" \
      >/dev/null 2>"$work/$row.log" &
    pid=$!
    pids+=("$pid")
    wait_for_port "$port"
    before=$(cpu_ticks "$pid")
    output=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" \
      -H 'x-user-id: bench-user' -H "authorization: Bearer $token" "http://127.0.0.1:$port/")
    after=$(cpu_ticks "$pid")
    kill "$pid" 2>/dev/null || true
    sleep 0.3
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$output")
    requests=$(awk '/requests in/ {print $1}' <<<"$output")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$output")
    if [[ -n $non2xx ]]; then
      echo "bench: $row answered $non2xx non-2xx responses" >&2
      exit 1
    fi
    cpu=$(awk -v t=$((after - before)) -v hz="$clk_tck" -v n="$requests" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    echo "$round|$row|$rps|$cpu" >> "$results"
    echo "  $row: $rps requests/s, $cpu CPU µs/request" >&2
  done
done

python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    round_, row, rps, cpu = line.split("|")
    rows.setdefault(row, []).append((float(rps), float(cpu)))
print("\n| row | requests/s (median) | CPU µs/request (median) |")
print("|---|---:|---:|")
for row in ("header", "jwt"):
    print(f"| {row} | {statistics.median(r for r, _ in rows[row]):,.0f} | {statistics.median(c for _, c in rows[row]):.2f} |")
rps = [j[0] / h[0] for h, j in zip(rows["header"], rows["jwt"])]
cpu = [j[1] / h[1] for h, j in zip(rows["header"], rows["jwt"])]
print(f"\njwt ÷ header per round, requests/s: {' '.join(f'{r:.3f}' for r in rps)} (median {statistics.median(rps):.3f})")
print(f"jwt ÷ header per round, CPU per request: {' '.join(f'{c:.3f}' for c in cpu)} (median {statistics.median(cpu):.3f})")
PY
