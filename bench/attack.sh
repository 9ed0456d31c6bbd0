#!/usr/bin/env bash
# Memory under attack: a gateway on the memory store (max_keys = MAX_KEYS) takes a new key on
# every request (rotating IPv6 /64s and X-User-Id values) at KEYS_PER_MINUTE for SECONDS, while
# one legitimate client asks 20 times a second under its own key. Prints the gateway's RSS
# along the way, and fails if the legitimate client's limit did not hold or RSS grew past what
# MAX_KEYS buckets take (86 bytes each, docs/performance.md) plus HEADROOM_MIB for the rest
# (connections, buffers). Loopback only; bounded by SECONDS.
#
#   bench/attack.sh                          # 60 s, 1,000,000 keys per minute, max_keys 200,000
#   SECONDS_TO_RUN=20 KEYS_PER_MINUTE=300000 bench/attack.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh

run_seconds="${SECONDS_TO_RUN:-60}"
keys_per_minute="${KEYS_PER_MINUTE:-1000000}"
max_keys="${MAX_KEYS:-200000}"
headroom_mib="${HEADROOM_MIB:-16}"
# Slow to refill, so that the attacker's buckets stay (a refilled one is swept) and the
# store reaches max_keys.
capacity=10
rate_per_minute=1

cargo build --release --quiet --bin tollgate --example fast_upstream --example attack
port=$(free_port); admin=$(free_port); upstream=$(free_port)
cat > "$work/policy.toml" <<CONF
[server]
listen = ["127.0.0.1:$port"]
[admin]
listen = "127.0.0.1:$admin"
[client_ip]
trusted_hops = 1
ipv6_prefix = 64
[store]
backend = "memory"
max_keys = $max_keys
[upstreams.app]
url = "http://127.0.0.1:$upstream"
[limits.per_network]
key = "client_network"
capacity = $capacity
rate = "$rate_per_minute/min"
[limits.per_user]
key = { header = "x-user-id" }
capacity = $capacity
rate = "$rate_per_minute/min"
[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["per_network", "per_user"]
CONF
./target/release/examples/fast_upstream "127.0.0.1:$upstream" >/dev/null 2>&1 &
pids+=($!)
./target/release/tollgate run --config "$work/policy.toml" >"$work/gateway.log" 2>&1 &
gateway=$!
pids+=($gateway)
wait_for_port "$port"
wait_for_port "$upstream"
echo "attack: $run_seconds s at $keys_per_minute keys per minute; max_keys $max_keys; limit $capacity + $rate_per_minute/min"
./target/release/examples/attack "127.0.0.1:$port" "$gateway" "$run_seconds" "$keys_per_minute" "$capacity" "$(python3 -c "print($rate_per_minute / 60)")" | tee "$work/attack.out"
baseline=$(sed -n 's/.*RSS: \([0-9.]*\) MiB at the start.*/\1/p' "$work/attack.out")
peak=$(sed -n 's/.*peak \([0-9.]*\) MiB.*/\1/p' "$work/attack.out")
python3 - "$baseline" "$peak" "$max_keys" "$headroom_mib" <<'PY'
import sys
baseline, peak, max_keys, headroom = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
bound = max_keys * 86 / 2**20
print(f"RSS grew {peak - baseline:.1f} MiB; max_keys buckets take {bound:.1f} MiB, plus {headroom:.0f} MiB headroom")
if peak - baseline > bound + headroom:
    print("FAIL: RSS grew past the max_keys bound"); sys.exit(1)
PY
echo "gateway log lines naming max_keys (the bound was reached): $(grep -c max_keys "$work/gateway.log" || true)"
