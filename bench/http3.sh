#!/usr/bin/env bash
# HTTP/3 beside HTTP/2 with TLS, in one run: the gateway's CPU per request for admitted and
# refused requests from one client over one keep-alive connection (examples/h3_load), and the
# CPU of a new QUIC connection's first packet when it is answered with a Retry beside when it
# starts a handshake (tests/fixtures/quic_flood.py sends the Initials).
#
#   bench/http3.sh
#   BENCH_REQUESTS=40000 BENCH_INITIALS=1000 BENCH_ROUNDS=5 bench/http3.sh
#
# Per row: the median over the rounds of the gateway's CPU µs (user + system from
# /proc/PID/stat), and HTTP/3 ÷ HTTP/2 (Retry ÷ handshake for the Initials). The client and
# upstream run on CPU 0, the gateway with one worker thread on CPU 1. Loopback only; each run
# is bounded in requests; everything started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=${BENCH_REQUESTS:-20000}
INITIALS=${BENCH_INITIALS:-900}
ROUNDS=${BENCH_ROUNDS:-3}
source bench/common.sh
whole_numbers "BENCH_REQUESTS=$REQUESTS" "BENCH_INITIALS=$INITIALS" "BENCH_ROUNDS=$ROUNDS"
if ((INITIALS > 1000)); then
  echo "bench: BENCH_INITIALS at most 1000 (past 1000 handshakes in progress, Initials get Retries)" >&2
  exit 1
fi
need_tools taskset openssl python3
python=${TOLLGATE_TEST_PYTHON:-target/test-python/bin/python}
"$python" -c "import aioquic" 2>/dev/null || {
  echo "bench: $python lacks aioquic (scripts/test.sh installs it)" >&2
  exit 1
}

echo "building the release binary..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream --example h3_load

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost" \
  -addext "basicConstraints=critical,CA:FALSE" \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
start_fast_upstream

# policy PORT ADMIN_PORT [EXTRA]: TLS on PORT over TCP and UDP, /admit without limits that
# refuse, /refuse with a limit spent after one request.
policy() {
  cat <<CONF
[server]
listen = ["127.0.0.1:$1"]
tls = { cert = "$work/cert.pem", key = "$work/key.pem" }
[server.http3]
listen = ["127.0.0.1:$1"]
${3:-}
[admin]
listen = "127.0.0.1:$2"
[upstreams.app]
url = "http://127.0.0.1:$upstream_port"
[limits.roomy]
key = "client_network"
capacity = 1000000000000
rate = "1000000000/s"
[limits.spent]
key = "client_network"
capacity = 1
rate = "1/h"
[[routes]]
name = "refuse"
path_prefix = "/refuse"
upstream = "app"
limits = ["spent"]
[[routes]]
name = "admit"
path_prefix = "/"
upstream = "app"
limits = ["roomy"]
CONF
}

# requests PROTOCOL PATH: the gateway's CPU µs per request over one connection.
requests() {
  local before after output
  taskset -c 0 ./target/release/examples/h3_load "$1" "127.0.0.1:$port" "$work/cert.pem" "$2" 1000 >/dev/null
  before=$(cpu_ticks "$gateway")
  output=$(taskset -c 0 ./target/release/examples/h3_load "$1" "127.0.0.1:$port" "$work/cert.pem" "$2" "$REQUESTS")
  after=$(cpu_ticks "$gateway")
  echo "  $1 $2: $output" >&2
  awk -v t=$((after - before)) -v hz="$clk_tck" -v n="$REQUESTS" 'BEGIN {printf "%.2f\n", t * 1e6 / hz / n}'
}

# initials: the gateway's CPU µs per Initial from one source.
initials() {
  local before after output
  before=$(cpu_ticks "$gateway")
  output=$(taskset -c 0 "$python" tests/fixtures/quic_flood.py <<<"{\"host\": \"127.0.0.1\", \"port\": $port, \"initials\": $INITIALS}")
  after=$(cpu_ticks "$gateway")
  echo "  initials: $output" >&2
  awk -v t=$((after - before)) -v hz="$clk_tck" -v n="$INITIALS" 'BEGIN {printf "%.2f\n", t * 1e6 / hz / n}'
}

clk_tck=$(getconf CLK_TCK)
: > "$work/rows"
for round in $(seq 1 "$ROUNDS"); do
  port=$(free_port)
  admin=$(free_port)
  policy "$port" "$admin" > "$work/policy.toml"
  start_gateway "$work/policy.toml" "$port"
  for protocol in h2 h3; do
    cpu=$(requests "$protocol" /)
    echo "admitted $protocol $cpu" >> "$work/rows"
    cpu=$(requests "$protocol" /refuse)
    echo "refused $protocol $cpu" >> "$work/rows"
  done
  cpu=$(initials)
  echo "initial handshake $cpu" >> "$work/rows"
  kill "$gateway" && wait "$gateway" 2>/dev/null || true

  # The client's network has no new connection left (start_gateway's probe, over TCP, took
  # the only one): every Initial is answered with a Retry.
  port=$(free_port)
  admin=$(free_port)
  policy "$port" "$admin" $'[server.connections]\nper_network = { capacity = 1, rate = "1/h" }' > "$work/policy.toml"
  start_gateway "$work/policy.toml" "$port"
  cpu=$(initials)
  echo "initial retry $cpu" >> "$work/rows"
  kill "$gateway" && wait "$gateway" 2>/dev/null || true
  echo "round $round done" >&2
done

python3 - "$work/rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, protocol, cpu = line.split()
    rows.setdefault(kind, {}).setdefault(protocol, []).append(float(cpu))
med = {kind: {p: statistics.median(v) for p, v in runs.items()} for kind, runs in rows.items()}
print("| row | HTTP/2 + TLS CPU µs | HTTP/3 CPU µs | HTTP/3 ÷ HTTP/2 |")
print("|---|---:|---:|---:|")
for kind in ("admitted", "refused"):
    h2, h3 = med[kind]["h2"], med[kind]["h3"]
    print(f"| {kind}, one client, keep-alive | {h2:.2f} | {h3:.2f} | {h3 / h2:.2f} |")
print()
print("| a new connection's Initial | CPU µs | ÷ handshake |")
print("|---|---:|---:|")
handshake, retry = med["initial"]["handshake"], med["initial"]["retry"]
print(f"| answered with a handshake | {handshake:.2f} | 1.00 |")
print(f"| answered with a Retry | {retry:.2f} | {retry / handshake:.3f} |")
PY
