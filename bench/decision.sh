#!/usr/bin/env bash
# The decision listener's cost, beside the proxy listener's 429 path, in one gateway process on
# one core (CPU 1; the load generators on CPU 0), the rows interleaved round by round:
#
#   429        the proxy listener refusing (wrk, keep-alive)
#   fa-allow   a forward-auth sub-request to /decide, admitted (wrk, keep-alive)
#   fa-refuse  a forward-auth sub-request, refused by the same limit as the 429 row
#   grpc       Envoy's ShouldRateLimit, one remote_address descriptor, admitted (h2load, h2c)
#
# Each row prints requests/s and the gateway's CPU (user + system) per request, and the ratio
# of each row's CPU to the 429 row's of the same round. Targets: forward-auth ≤ 1.0×, gRPC
# ≤ 2.0×. With NGINX=1 it also measures nginx auth_request's overhead: nginx → tollgate → 200
# against nginx alone proxying to the same upstream (nginx's and tollgate's CPU per request).
#
#   bench/decision.sh                  # 3 rounds of 10 s per row, 32 connections
#   BENCH_ROUNDS=5 NGINX=1 bench/decision.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
ROUNDS=${BENCH_ROUNDS:-3}
whole_numbers DURATION="$DURATION" CONNECTIONS="$CONNECTIONS" ROUNDS="$ROUNDS"
need_tools wrk taskset python3
command -v h2load >/dev/null || { echo "bench: missing h2load (apt-get install nghttp2-client)" >&2; exit 1; }

cargo build --release --quiet --bin tollgate --example fast_upstream
start_fast_upstream

port=$(free_port) decision_port=$(free_port) admin_port=$(free_port)
cat >"$work/policy.toml" <<CONF
[server]
listen = ["127.0.0.1:$port"]
[admin]
listen = "127.0.0.1:$admin_port"
[decision]
listen = "127.0.0.1:$decision_port"
[[decision.descriptors]]
domain = "edge"
entries = ["remote_address"]
limit = "open"
[upstreams.app]
url = "http://127.0.0.1:$upstream_port"
[limits.closed]
key = "client_network"
capacity = 1
rate = "1/h"
[limits.open]
key = "client_network"
capacity = 1000000000
rate = "1000000000/s"
[[routes]]
name = "refused"
path_prefix = "/refused"
upstream = "app"
limits = ["closed"]
[[routes]]
name = "open"
path_prefix = "/"
upstream = "app"
limits = ["open"]
CONF

RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 \
  ./target/release/tollgate --worker-threads 1 run --config "$work/policy.toml" >/dev/null 2>&1 &
gateway=$!
pids+=("$gateway")
wait_for_port "$port"
wait_for_port "$decision_port"

# One framed RateLimitRequest { domain: "edge", descriptors: [{ remote_address: 203.0.113.9 }] }.
python3 - "$work/call.bin" <<'PY'
import struct, sys
def field(tag, payload): return bytes([tag << 3 | 2, len(payload)]) + payload
entry = field(1, b"remote_address") + field(2, b"203.0.113.9")
message = field(1, b"edge") + field(2, field(1, entry))
open(sys.argv[1], "wb").write(b"\0" + struct.pack(">I", len(message)) + message)
PY

# measure PID COMMAND...: runs COMMAND (a load generator printing its request count) on CPU 0
# and prints "requests/s cpu_us_per_request" of PID.
measure() {
  local pid=$1 before after output requests
  shift
  before=$(cpu_ticks "$pid")
  output=$(taskset -c 0 "$@" 2>&1)
  after=$(cpu_ticks "$pid")
  if [[ $1 == h2load ]]; then
    requests=$(awk '/^requests:/ {print $8}' <<<"$output")
    if [[ $(awk '/^status codes:/ {print $3}' <<<"$output") != "$requests" ]]; then
      echo "bench: h2load saw answers other than 200:" >&2
      echo "$output" >&2
      exit 1
    fi
  else
    requests=$(awk '/requests in/ {print $1}' <<<"$output")
  fi
  awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" -v d="$DURATION" \
    'BEGIN {printf "%.0f %.3f\n", n / d, t * 1e6 / hz / n}'
}

ask_headers=(-H "X-Forwarded-Method: GET" -H "X-Forwarded-For: 203.0.113.9")
wrk_load() { echo wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "$@"; }
row_429() { measure "$gateway" $(wrk_load) "http://127.0.0.1:$port/refused"; }
row_fa_allow() {
  measure "$gateway" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "${ask_headers[@]}" \
    -H "X-Forwarded-Uri: /api/items" "http://127.0.0.1:$decision_port/decide"
}
row_fa_refuse() {
  measure "$gateway" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "${ask_headers[@]}" \
    -H "X-Forwarded-Uri: /refused/items" "http://127.0.0.1:$decision_port/decide"
}
row_grpc() {
  measure "$gateway" h2load -D "$DURATION" -c "$CONNECTIONS" -m 4 -t 1 \
    -H "content-type: application/grpc" -H "te: trailers" -d "$work/call.bin" \
    "http://127.0.0.1:$decision_port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
}

# Warm up every row once (the 429 row's first request is admitted, and spends the bucket).
for row in row_429 row_fa_allow row_fa_refuse row_grpc; do
  DURATION=1 "$row" >/dev/null
done

echo "round row        requests/s  cpu_us/req  ÷429"
for round in $(seq 1 "$ROUNDS"); do
  read -r rps base <<<"$(row_429)"
  printf "%5d %-10s %10s %11s %5s\n" "$round" 429 "$rps" "$base" 1.00
  for row in fa-allow fa-refuse grpc; do
    read -r rps cpu <<<"$("row_${row//-/_}")"
    printf "%5d %-10s %10s %11s %5.2f\n" "$round" "$row" "$rps" "$cpu" \
      "$(awk -v a="$cpu" -v b="$base" 'BEGIN {print a / b}')"
  done
done

[[ ${NGINX:-0} == 1 ]] || exit 0
need_tools nginx
nginx_dir="$work/nginx"
mkdir -p "$nginx_dir"
nginx_port=$(free_port)
# nginx_site AUTH: nginx on CPU 0 proxying to the upstream, asking tollgate first when AUTH is 1.
nginx_site() {
  local auth=""
  if [[ $1 == 1 ]]; then
    auth="auth_request /_tollgate;"
  fi
  cat <<CONF
worker_processes 1;
daemon off;
pid $nginx_dir/nginx.pid;
error_log $nginx_dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream app { server 127.0.0.1:$upstream_port; keepalive 64; }
  upstream tollgate { server 127.0.0.1:$decision_port; keepalive 64; }
  server {
    listen 127.0.0.1:$nginx_port;
    location / {
      $auth
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
    location = /_tollgate {
      internal;
      proxy_pass http://tollgate/decide;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header X-Original-Method \$request_method;
      proxy_set_header X-Original-URI \$request_uri;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    }
  }
}
CONF
}
echo
echo "nginx auth_request: CPU per request of nginx and of tollgate, nginx pinned to CPU 1 too"
echo "round setup          requests/s  nginx_us  tollgate_us"
for round in $(seq 1 "$ROUNDS"); do
  for auth in 0 1; do
    nginx_site "$auth" >"$nginx_dir/nginx.conf"
    # NGINX in its environment would be read as sockets handed over by a parent nginx.
    env -u NGINX taskset -c 1 nginx -c "$nginx_dir/nginx.conf" -p "$nginx_dir" &
    nginx=$!
    wait_for_port "$nginx_port"
    worker=$(pgrep -P "$nginx" | head -1)
    taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d1s "http://127.0.0.1:$nginx_port/api" >/dev/null
    before_gateway=$(cpu_ticks "$gateway")
    read -r rps nginx_cpu <<<"$(measure "$worker" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$nginx_port/api")"
    after_gateway=$(cpu_ticks "$gateway")
    gateway_cpu=$(awk -v t=$((after_gateway - before_gateway)) -v hz="$(getconf CLK_TCK)" -v r="$rps" -v d="$DURATION" \
      'BEGIN {printf "%.3f", t * 1e6 / hz / (r * d)}')
    setup=$([[ $auth == 1 ]] && echo "nginx+tollgate" || echo "nginx alone")
    printf "%5d %-14s %10s %9s %12s\n" "$round" "$setup" "$rps" "$nginx_cpu" "$gateway_cpu"
    kill "$nginx" 2>/dev/null || true
    wait "$nginx" 2>/dev/null || true
  done
done
