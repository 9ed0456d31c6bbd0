#!/usr/bin/env bash
# What `[upstreams.NAME] reuse = "per_client"` costs beside `"shared"`, in one run: the proxied
# row (three limits that never refuse) with clients that keep their connections alive, and with
# clients that open a connection per request (`Connection: close`), each for both settings in
# interleaved rounds.
#
#   bench/reuse.sh
#   BENCH_DURATION=8 BENCH_ROUNDS=5 bench/reuse.sh
#
# Per row and setting: the median over the rounds of requests/s and the gateway's CPU µs per
# request (user + system from /proc/PID/stat), then per_client ÷ shared. Load generator and
# upstream on CPU 0, the gateway on CPU 1, as in bench/run.sh. Everything started here is
# stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-8}
ROUNDS=${BENCH_ROUNDS:-3}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
source bench/common.sh
whole_numbers "BENCH_DURATION=$DURATION" "BENCH_ROUNDS=$ROUNDS" "BENCH_CONNECTIONS=$CONNECTIONS"
need_tools wrk taskset python3

echo "building the release binary..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream

start_fast_upstream

# run REUSE KEEP_ALIVE: one gateway, one wrk run; prints "requests/s cpu_us".
run() {
  local reuse=$1 keep_alive=$2 port admin
  local headers=(-H 'x-user-id: bench-user')
  [[ $keep_alive == no ]] && headers+=(-H 'Connection: close')
  port=$(free_port)
  admin=$(free_port)
  three_limit_policy "$port" "$admin" "$upstream_port" "" 1000000000000 1000000000/s \
    | sed "s|^url = \"http://127.0.0.1:$upstream_port\"|&\nreuse = \"$reuse\"|" > "$work/policy.toml"
  measure_gateway ./target/release/tollgate "$work/policy.toml" "$port" "${headers[@]}"
}

: > "$work/reuse"
for round in $(seq 1 "$ROUNDS"); do
  for keep_alive in yes no; do
    for reuse in shared per_client; do
      result=$(run "$reuse" "$keep_alive")
      echo "$round keep-alive:$keep_alive $reuse $result" | tee -a "$work/reuse" >&2
    done
  done
done

python3 - "$work/reuse" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    round_, name, reuse, rps, cpu = line.split()
    rows.setdefault(name, {}).setdefault(reuse, []).append((float(rps), float(cpu)))
print("| clients | shared requests/s | per_client requests/s | shared CPU µs/req | per_client CPU µs/req | per_client ÷ shared CPU (per round) | median |")
print("|---|---:|---:|---:|---:|---|---:|")
for name, runs in rows.items():
    shared, per_client = runs["shared"], runs["per_client"]
    ratios = [p[1] / s[1] for s, p in zip(shared, per_client)]
    print(f"| {name} | {statistics.median(x[0] for x in shared):,.0f} | {statistics.median(x[0] for x in per_client):,.0f} "
          f"| {statistics.median(x[1] for x in shared):.2f} | {statistics.median(x[1] for x in per_client):.2f} "
          f"| {', '.join(f'{r:.3f}' for r in ratios)} | {statistics.median(ratios):.3f} |")
PY
