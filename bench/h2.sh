#!/usr/bin/env bash
# HTTP/2: tollgate against nginx limit_req, refused and admitted, over h2c (prior knowledge)
# and TLS, in rounds (the table gives each row's median over the rounds, and each tollgate
# row's ratio to nginx's row of the same round, whose median is the figure to quote).
#
#   bench/h2.sh                                  # 5 rounds of 10 s per row
#   BENCH_ROUNDS=7 BENCH_DURATION=5 BENCH_STREAMS=16 bench/h2.sh
#
# The proxy's user + system time per request (from /proc/PID/stat; one worker, on CPU 1;
# h2load and the upstream on CPU 0), for nginx with one limit, tollgate with the same one
# limit (by client address) and tollgate with three (address, header, global). h2load opens
# 8 connections, each with BENCH_STREAMS streams at a time (default 4), and keeps them for
# the whole row: TLS costs its record encryption here, not its handshakes. Both proxies
# forward to the upstream over HTTP/1.1 keep-alive connections.
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/common.sh
DURATION=${BENCH_DURATION:-10}
ROUNDS=${BENCH_ROUNDS:-5}
STREAMS=${BENCH_STREAMS:-4}
whole_numbers "BENCH_DURATION=$DURATION" "BENCH_ROUNDS=$ROUNDS" "BENCH_STREAMS=$STREAMS"
need_tools h2load nginx openssl taskset python3

echo "building release binaries..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream
start_fast_upstream
self_signed_certificate

# start_proxy KIND TRANSPORT (h2c or tls) LIMITS (one or three) OUTCOME (refused or
# admitted): nginx (one worker, serving in its master process so that one PID holds its CPU
# time) or tollgate, on CPU 1; sets $proxy (its PID) and $url.
start_proxy() {
  local kind=$1 transport=$2 limits=$3 outcome=$4 port capacity=1 rate="1/h"
  port=$(free_port)
  url="http://127.0.0.1:$port/"
  [[ "$transport" == tls ]] && url="https://127.0.0.1:$port/"
  [[ "$outcome" == admitted ]] && capacity=1000000000000 rate="1000000000/s"
  if [[ "$kind" == nginx ]]; then
    local zone="limit_req_zone \$binary_remote_addr zone=one:10m rate=1r/m;"
    local directives="limit_req zone=one; limit_req_status 429; limit_req_log_level info;"
    if [[ "$outcome" == admitted ]]; then
      zone="limit_req_zone \$binary_remote_addr zone=one:10m rate=100000000r/s;"
      directives="limit_req zone=one burst=1000000 nodelay; limit_req_log_level info;"
    fi
    # h2load does not reconnect, and nginx ends a connection after 1,000 requests by default.
    local listen=http2 server="keepalive_requests 100000000;"
    if [[ "$transport" == tls ]]; then
      listen="ssl http2"
      server+=" ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem;"
    fi
    rm -rf "$work/nginx" && mkdir -p "$work/nginx"
    nginx_conf "$work/nginx" "$port" "$upstream_port" "$directives" "$zone" \
      "master_process off;" "$listen" "$server" > "$work/nginx/nginx.conf"
    taskset -c 1 nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" >/dev/null 2>&1 &
    proxy=$!
    pids+=("$proxy")
    wait_for_port "$port"
  else
    local names='"per_network"'
    [[ "$limits" == three ]] && names='"per_network", "per_user", "everyone"'
    three_limit_policy "$port" "$(free_port)" "$upstream_port" "" "$capacity" "$rate" "" \
      "$names" > "$work/policy.toml"
    [[ "$transport" == tls ]] && tls_policy "$work/policy.toml"
    start_gateway "$work/policy.toml" "$port"
    proxy=$gateway
  fi
}

# cpu_row ROW PROXY_NAME EXPECTED_STATUS: h2load against $url for $DURATION s after 2 s of
# warm-up; records "ROW|PROXY_NAME|requests/s|CPU µs per request|system µs". Stops the script
# if an answer is not EXPECTED_STATUS (200 or 429) or a stream fails.
cpu_row() {
  local row=$1 name=$2 expected=$3 output done expected_done errored
  local before after system_before system_after
  local load=(taskset -c 0 h2load -c8 -m"$STREAMS" -H 'x-user-id: bench-user')
  "${load[@]}" -D 2 "$url" >/dev/null
  before=$(cpu_ticks "$proxy") system_before=$(system_ticks "$proxy")
  output=$("${load[@]}" -D "$DURATION" "$url" 2>&1)
  after=$(cpu_ticks "$proxy") system_after=$(system_ticks "$proxy")
  done=$(awk '/^requests:/ {print $6}' <<<"$output")
  errored=$(awk '/^requests:/ {print $12 + $14}' <<<"$output")
  if [[ "$expected" == 200 ]]; then
    expected_done=$(awk '/^status codes:/ {print $3}' <<<"$output")
  else
    expected_done=$(awk '/^status codes:/ {print $7}' <<<"$output")
  fi
  if [[ -z "$done" ]] || ((done == 0 || errored > 0 || expected_done < done * 99 / 100)); then
    echo "bench: $name on \"$row\": not every answer was $expected:" >&2
    echo "$output" >&2
    exit 1
  fi
  record_cpu_row "$row" "$name" $((after - before)) $((system_after - system_before)) "$done"
}

: > "$work/cpu"
echo "running about $((ROUNDS * 12 * (DURATION + 2))) s of load..." >&2
for round in $(seq "$ROUNDS"); do
  echo " round $round of $ROUNDS" >&2
  for transport in h2c tls; do
    for outcome in refused admitted; do
      row="$outcome, $transport" status=429
      [[ "$outcome" == admitted ]] && status=200
      start_proxy nginx "$transport" one "$outcome"
      cpu_row "$row" "nginx, 1 limit" "$status"; stop_proxy
      start_proxy tollgate "$transport" one "$outcome"
      cpu_row "$row" "tollgate, 1 limit" "$status"; stop_proxy
      start_proxy tollgate "$transport" three "$outcome"
      cpu_row "$row" "tollgate, 3 limits" "$status"; stop_proxy
    done
  done
done

python3 bench/cpu_table.py "$work/cpu" "$ROUNDS"
