#!/usr/bin/env bash
# User-space instructions per proxied request, counted by callgrind: the row-4 setup (memory
# store, one worker thread, three limits that never reject) under a fixed load. Unlike time,
# the count does not move with whatever else the machine is doing, so it shows what a change
# to the hot path is worth.
#
#   bench/instructions.sh            # the count
#   TOP=40 bench/instructions.sh     # and the 40 functions with the most instructions (inclusive)
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in wrk valgrind callgrind_control python3 taskset; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench: missing $tool. On Debian: apt-get install wrk valgrind python3" >&2
    exit 1
  fi
done

cargo build --release --quiet --bin tollgate --example fast_upstream

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_for_port() {
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "bench: nothing listens on port $1" >&2
  exit 1
}

upstream_port=$(free_port)
# As in bench/run.sh: load generator and upstream on CPU 0, the gateway on CPU 1. How requests
# batch up depends on it, and with that the count.
taskset -c 0 ./target/release/examples/fast_upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 &
pids+=($!)
wait_for_port "$upstream_port"

port=$(free_port)
admin=$(free_port)
cat > "$work/policy.toml" <<CONF
[server]
listen = ["127.0.0.1:$port"]
[admin]
listen = "127.0.0.1:$admin"
[upstreams.app]
url = "http://127.0.0.1:$upstream_port"
[limits.per_network]
key = "client_network"
capacity = 1000000000000
rate = "1000000000/s"
[limits.per_user]
key = { header = "x-user-id" }
capacity = 1000000000000
rate = "1000000000/s"
[limits.everyone]
key = "global"
capacity = 1000000000000
rate = "1000000000/s"
[[routes]]
name = "bench"
path_prefix = "/"
upstream = "app"
limits = ["per_network", "per_user", "everyone"]
CONF

RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 valgrind --tool=callgrind \
  --compress-strings=no --compress-pos=no --callgrind-out-file="$work/callgrind.%p" \
  ./target/release/tollgate --worker-threads 1 run --config "$work/policy.toml" >/dev/null 2>"$work/valgrind.log" &
gateway=$!
pids+=("$gateway")
wait_for_port "$port"

load() {
  taskset -c 0 wrk -t1 -c8 -d"$1" -H 'x-user-id: bench-user' "http://127.0.0.1:$port/"
}
load 3s >/dev/null # warm-up: connections, pools, caches
callgrind_control --zero "$gateway" >/dev/null
output=$(load 8s)
callgrind_control --dump "$gateway" >/dev/null
requests=$(awk '/requests in/ {print $1}' <<<"$output")

python3 - "$work" "$requests" "${TOP:-0}" <<'PY'
import collections, glob, sys
work, requests, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dump = sorted(glob.glob(f"{work}/callgrind.*.1"))[-1]
inclusive, total = collections.Counter(), 0
function = callee = None
in_call = False
for line in open(dump):
    if line.startswith("fn="):
        function = line[3:].strip()
    elif line.startswith("cfn="):
        callee = line[4:].strip()
    elif line.startswith("calls="):
        in_call = True
    elif line[:1].isdigit():
        cost = int(line.split()[1])
        if in_call:
            in_call = False
            if callee != function:
                inclusive[function] += cost
        else:
            inclusive[function] += cost
            total += cost
print(f"{requests} requests, {total / requests:,.0f} user-space instructions per request")
for name, cost in inclusive.most_common(top):
    print(f"{cost / requests:10,.0f}  {name[:150]}")
PY
