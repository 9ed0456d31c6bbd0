#!/usr/bin/env bash
# What keying by the TLS fingerprint and the network's owner costs on the TLS admitted path, in
# one gateway process on one core (CPU 1; wrk and the upstream on CPU 0), rows interleaved round
# by round:
#
#   plain        HTTPS, keep-alive, one limit keyed by client_network
#   fingerprint  the same, its limit keyed by ["tls_ja4", "client_asn"] ([geoip] with an ASN
#                database that knows 127.0.0.0/8)
#   plain-new, fingerprint-new   the same two with a new connection (and TLS handshake) per
#                request: the fingerprint's cost where it is paid, once per connection
#
# Each row prints requests/s and the gateway's CPU (user + system) per request; each
# fingerprint row its ratio to the plain row of the same round. Target: ≤ 1.05× (keep-alive).
#
#   bench/bots.sh                        # 3 rounds of 10 s per row, 32 connections
#   BENCH_ROUNDS=5 bench/bots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
ROUNDS=${BENCH_ROUNDS:-3}
whole_numbers DURATION="$DURATION" CONNECTIONS="$CONNECTIONS" ROUNDS="$ROUNDS"
need_tools wrk taskset openssl
python=${TOLLGATE_TEST_PYTHON:-target/test-python/bin/python}
if ! "$python" -c "import mmdb_writer" 2>/dev/null; then
  echo "bench: needs $python with mmdb-writer (scripts/test.sh installs it)" >&2
  exit 1
fi

cargo build --release --quiet --bin tollgate --example fast_upstream
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
start_fast_upstream

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
"$python" - "$work/asn.mmdb" <<'PY'
import sys
from mmdb_writer import MMDBWriter
from netaddr import IPSet
writer = MMDBWriter(ip_version=6, database_type="GeoLite2-ASN", ipv4_compatible=True)
writer.insert_network(IPSet(["127.0.0.0/8"]), {"autonomous_system_number": 4200000000})
writer.to_db_file(sys.argv[1])
PY

port=$(free_port) admin_port=$(free_port)
cat >"$work/policy.toml" <<CONF
[server]
listen = ["127.0.0.1:$port"]
tls = { cert = "$work/cert.pem", key = "$work/key.pem" }
[admin]
listen = "127.0.0.1:$admin_port"
[geoip]
asn_db = "$work/asn.mmdb"
[upstreams.app]
url = "http://127.0.0.1:$upstream_port"
[limits.per_network]
key = "client_network"
capacity = 1000000000
rate = "1000000000/s"
[limits.per_fingerprint]
key = ["tls_ja4", "client_asn"]
missing = "reject"
capacity = 1000000000
rate = "1000000000/s"
[[routes]]
name = "fingerprint"
path_prefix = "/fingerprint"
upstream = "app"
limits = ["per_fingerprint"]
[[routes]]
name = "plain"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
CONF

start_gateway "$work/policy.toml" "$port"

# row PATH [WRK_ARGUMENTS...]: the gateway's requests/s and CPU per request on PATH.
row() {
  local path=$1
  shift
  gateway_row "https://localhost:$port$path" "$@"
}

for path in / /fingerprint; do
  DURATION=1 row "$path" >/dev/null
done

echo "round row              requests/s  cpu_us/req  ÷plain"
for round in $(seq 1 "$ROUNDS"); do
  for mode in keep new; do
    args=()
    suffix=""
    if [[ $mode == new ]]; then
      args=(-H "Connection: close")
      suffix="-new"
    fi
    read -r rps base <<<"$(row / "${args[@]}")"
    printf "%5d %-16s %10s %11s %6s\n" "$round" "plain$suffix" "$rps" "$base" 1.00
    read -r rps cpu <<<"$(row /fingerprint "${args[@]}")"
    printf "%5d %-16s %10s %11s %6.2f\n" "$round" "fingerprint$suffix" "$rps" "$cpu" \
      "$(awk -v a="$cpu" -v b="$base" 'BEGIN {print a / b}')"
  done
done
