#!/usr/bin/env bash
# What settling a cost after the response costs, in one gateway process on one core (CPU 1; wrk
# and the upstream on CPU 0), the rows interleaved round by round:
#
#   plain-json    a 4 KiB JSON response, admitted by a limit that does not settle
#   settled-json  the same response, its limit settled by { json = "usage.total_tokens" }
#   plain-sse     a 101-event stream (OpenAI-style, usage last), admitted, not settled
#   settled-sse   the same stream, settled by its last usage event
#
# Each row prints requests/s and the gateway's CPU (user + system) per request; each settled row
# its ratio to the plain row of the same body and round. Target: ≤ 1.15×. Then the memory of a
# stream in flight: STREAMS streams held open mid-way (50 events sent) on a plain route and on a
# settled one, the gateway's resident memory per stream above idle for each. Target: the
# settled stream's extra ≤ 16 KiB.
#
#   bench/settle.sh                      # 3 rounds of 10 s per row, 32 connections, 500 streams
#   BENCH_ROUNDS=5 STREAMS=1000 bench/settle.sh
#   INSTRUCTIONS=1 bench/settle.sh       # instead: user-space instructions per request of each
#                                        # row, counted by callgrind (steady where µs swing);
#                                        # DUMP=DIR keeps each row's profile there
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
ROUNDS=${BENCH_ROUNDS:-3}
STREAMS=${STREAMS:-500}
whole_numbers DURATION="$DURATION" CONNECTIONS="$CONNECTIONS" ROUNDS="$ROUNDS" STREAMS="$STREAMS"
need_tools wrk taskset python3
[[ -n "${INSTRUCTIONS:-}" ]] && need_tools valgrind callgrind_control callgrind_annotate

cargo build --release --quiet --bin tollgate --example fast_upstream
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
start_fast_upstream

port=$(free_port) admin_port=$(free_port)
cat >"$work/policy.toml" <<CONF
[server]
listen = ["127.0.0.1:$port"]
[admin]
listen = "127.0.0.1:$admin_port"
[upstreams.app]
url = "http://127.0.0.1:$upstream_port"
[limits.org_tokens]
key = "client_network"
capacity = 1000000000
rate = "1000000000/s"
[[routes]]
name = "settled"
path_prefix = "/settled"
upstream = "app"
limits = [{ limit = "org_tokens", cost = 1000, settle = { json = "usage.total_tokens" } }]
[[routes]]
name = "plain"
path_prefix = "/"
upstream = "app"
limits = [{ limit = "org_tokens", cost = 1000 }]
CONF

if [[ -n "${INSTRUCTIONS:-}" ]]; then
  RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 \
    valgrind --tool=callgrind --compress-strings=no --compress-pos=no \
    --callgrind-out-file="$work/callgrind.%p" \
    ./target/release/tollgate --worker-threads 1 run --config "$work/policy.toml" \
    >/dev/null 2>"$work/valgrind.log" &
  gateway=$!
  pids+=("$gateway")
  wait_for_port "$port"
  echo "row           requests  instructions/request  ÷plain"
  dumps=0
  for body in json sse; do
    for route in plain settled; do
      path=/$body
      [[ $route == settled ]] && path=/settled/$body
      taskset -c 0 wrk -t1 -c8 -d3s "http://127.0.0.1:$port$path" >/dev/null
      callgrind_control --zero "$gateway" >/dev/null 2>&1
      requests=$(taskset -c 0 wrk -t1 -c8 -d8s "http://127.0.0.1:$port$path" |
        awk '/requests in/ {print $1}')
      callgrind_control --dump "$gateway" >/dev/null 2>&1
      dumps=$((dumps + 1))
      total=$(callgrind_annotate "$work/callgrind.$gateway.$dumps" 2>/dev/null |
        awk '/PROGRAM TOTALS/ && !seen {gsub(",", "", $1); print $1; seen = 1}')
      per=$((total / requests))
      [[ -n "${DUMP:-}" ]] && cp "$work/callgrind.$gateway.$dumps" "$DUMP/$route-$body.callgrind"
      [[ $route == plain ]] && base=$per
      printf "%-13s %8d %21d %7.2f\n" "$route-$body" "$requests" "$per" \
        "$(awk -v a="$per" -v b="$base" 'BEGIN {print a / b}')"
    done
  done
  exit 0
fi

start_gateway "$work/policy.toml" "$port"

# row PATH: the gateway's requests/s and CPU per request on PATH.
row() {
  gateway_row "http://127.0.0.1:$port$1"
}

for path in /json /settled/json /sse /settled/sse; do
  DURATION=1 row "$path" >/dev/null
done

echo "round row           requests/s  cpu_us/req  ÷plain"
for round in $(seq 1 "$ROUNDS"); do
  for body in json sse; do
    read -r rps base <<<"$(row "/$body")"
    printf "%5d %-13s %10s %11s %6s\n" "$round" "plain-$body" "$rps" "$base" 1.00
    read -r rps cpu <<<"$(row "/settled/$body")"
    printf "%5d %-13s %10s %11s %6.2f\n" "$round" "settled-$body" "$rps" "$cpu" \
      "$(awk -v a="$cpu" -v b="$base" 'BEGIN {print a / b}')"
  done
done

# held PORT PID PATH: the resident KiB of gateway PID with STREAMS streams of PATH open and
# mid-way.
held() {
  python3 - "$1" "$STREAMS" "$3" "$2" <<'PY'
import asyncio, sys
port, count, path, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
async def stream():
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    seen = b""
    while seen.count(b"data:") < 50:
        chunk = await reader.read(65536)
        if not chunk:
            raise SystemExit("bench: a held stream closed early")
        seen += chunk
    return writer
async def main():
    writers = []
    for start in range(0, count, 100):
        writers += await asyncio.gather(*(stream() for _ in range(start, min(count, start + 100))))
    await asyncio.sleep(0.5)
    print(rss())
    for writer in writers:
        writer.close()
asyncio.run(main())
PY
}

kill "$gateway"
wait "$gateway" 2>/dev/null || true
echo
echo "streams in flight: $STREAMS held mid-way, each route in a fresh gateway process"
echo "route     idle_kib  held_kib  kib_per_stream"
for route in plain settled; do
  path=/sse-held
  [[ $route == settled ]] && path=/settled/sse-held
  RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 \
    ./target/release/tollgate --worker-threads 1 run --config "$work/policy.toml" >/dev/null 2>&1 &
  gateway=$!
  pids+=("$gateway")
  wait_for_port "$port"
  # One short request of each kind first: what every process allocates once is not per stream.
  taskset -c 0 wrk -t1 -c4 -d1s "http://127.0.0.1:$port/settled/sse" >/dev/null
  sleep 0.5
  idle=$(awk '/^VmRSS:/ {print $2}' "/proc/$gateway/status")
  with=$(held "$port" "$gateway" "$path")
  printf "%-9s %8s %9s %15.1f\n" "$route" "$idle" "$with" \
    "$(awk -v a="$with" -v b="$idle" -v n="$STREAMS" 'BEGIN {print (a - b) / n}')"
  kill "$gateway"
  wait "$gateway" 2>/dev/null || true
done
