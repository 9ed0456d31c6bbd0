#!/usr/bin/env bash
# Under a flood: tollgate against nginx limit_req, every row in one run, in rounds (the table
# gives each row's median over the rounds, and each tollgate row's ratio to nginx's row of the
# same round, whose median is the figure to quote).
#
#   bench/flood.sh                               # 5 rounds of 10 s per row
#   BENCH_ROUNDS=7 BENCH_DURATION=5 bench/flood.sh
#
# CPU rows (the proxy's user + system time per request, from /proc/PID/stat; one worker, on
# CPU 1; wrk and the upstream on CPU 0), each for nginx with one limit, tollgate with the same
# one limit (by client address) and tollgate with three (address, header, global):
#   refused, keep-alive           every request refused (429), 32 keep-alive connections
#   admitted, keep-alive          limits that never refuse
#   refused, a connection each    `Connection: close`: a TCP connection per request
#   refused, pipelined            16 requests per write on each keep-alive connection
# Each refused row also runs the floor under it (examples/fixed_answer): a one-thread tokio
# server that reads the same heads and writes the same fixed 429, deciding nothing. Its CPU per
# request is what a refusal costs this stack before any rule runs, and its system time is the
# kernel's share, which is about nginx's.
# Flood isolation: one key floods at wrk's full speed (32 connections) while a paced client
# (examples/paced_client) sends RATE legitimate requests a second under keys of their own; its
# p50, p99 and errors through nginx and tollgate (one limit by `X-User-Id` each), with the
# flood and without it.
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/common.sh
DURATION=${BENCH_DURATION:-10}
ROUNDS=${BENCH_ROUNDS:-5}
CONNECTIONS=32
RATE=${BENCH_PACED_RATE:-200}
whole_numbers "BENCH_DURATION=$DURATION" "BENCH_ROUNDS=$ROUNDS" "BENCH_PACED_RATE=$RATE"
need_tools wrk nginx taskset python3

echo "building release binaries..." >&2
cargo build --release --quiet --bin tollgate --example fast_upstream --example paced_client \
  --example fixed_answer
start_fast_upstream

# Pipelining: wrk sends 16 requests (with the command line's headers) in each write.
cat > "$work/pipeline.lua" <<'LUA'
init = function(args)
  local requests = {}
  for i = 1, 16 do requests[i] = wrk.format(nil, "/") end
  pipelined = table.concat(requests)
end
request = function() return pipelined end
LUA

# policy NAME PORT CAPACITY RATE LIMITS: one route over LIMITS (of per_network, per_user and
# everyone, each CAPACITY tokens refilled at RATE), written to $work/NAME.toml.
policy() {
  three_limit_policy "$2" "$(free_port)" "$upstream_port" "" "$3" "$4" "" "$5" > "$work/$1.toml"
}

# start_proxy KIND NAME [ZONE DIRECTIVES]: nginx (one worker, serving in its master process
# so that one PID holds its CPU time), tollgate from $work/NAME.toml, or the floor (the fixed
# answer), on CPU 1; sets $proxy (its PID) and $port.
start_proxy() {
  local kind=$1 name=$2
  port=$(free_port)
  if [[ "$kind" == floor ]]; then
    taskset -c 1 ./target/release/examples/fixed_answer "127.0.0.1:$port" >/dev/null 2>&1 &
    proxy=$!
    pids+=("$proxy")
    wait_for_port "$port"
  elif [[ "$kind" == nginx ]]; then
    mkdir -p "$work/$name"
    nginx_conf "$work/$name" "$port" "$upstream_port" "$4 limit_req_status 429;" "$3" \
      "master_process off;" > "$work/$name/nginx.conf"
    taskset -c 1 nginx -p "$work/$name" -c "$work/$name/nginx.conf" >/dev/null 2>&1 &
    proxy=$!
    pids+=("$proxy")
    wait_for_port "$port"
  else
    sed -i "s|^listen = \[.*|listen = [\"127.0.0.1:$port\"]|" "$work/$name.toml"
    start_gateway "$work/$name.toml" "$port"
    proxy=$gateway
  fi
}

# cpu_row ROW PROXY_NAME EXPECTED_STATUS [WRK_ARGUMENTS...]: wrk against $proxy for
# $DURATION s after 2 s of warm-up; records "ROW|PROXY_NAME|requests/s|CPU µs per request|
# system µs". Stops the script if an answer is not EXPECTED_STATUS (200 or 429) or a request
# fails.
cpu_row() {
  local row=$1 name=$2 expected=$3 url="http://127.0.0.1:$port/" output requests
  local before after system_before system_after
  shift 3
  taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d2s -H 'x-user-id: bench-user' "$@" "$url" >/dev/null
  before=$(cpu_ticks "$proxy") system_before=$(system_ticks "$proxy")
  output=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" -H 'x-user-id: bench-user' \
    "$@" "$url" 2>&1)
  after=$(cpu_ticks "$proxy") system_after=$(system_ticks "$proxy")
  requests=$(awk '/requests in/ {print $1}' <<<"$output")
  local other
  other=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$output")
  other=${other:-0}
  if { [[ "$expected" == 200 ]] && ((other > 0)); } ||
    { [[ "$expected" == 429 ]] && ((other < requests * 99 / 100)); } ||
    grep -q "Socket errors:.*\(read\|write\|timeout\) [1-9]" <<<"$output"; then
    echo "bench: $name on \"$row\": not every answer was $expected:" >&2
    echo "$output" >&2
    exit 1
  fi
  record_cpu_row "$row" "$name" $((after - before)) $((system_after - system_before)) "$requests"
}

# isolation_row PROXY_NAME FLOOD(yes/no): the paced client for $DURATION s against $proxy,
# with one key flooding beside it or not; records "PROXY_NAME|FLOOD|the client's line".
isolation_row() {
  local name=$1 flood=$2 flooder="" line
  if [[ "$flood" == yes ]]; then
    taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"$((DURATION + 2))s" -H 'x-user-id: flooder' \
      "http://127.0.0.1:$port/" >/dev/null 2>&1 &
    flooder=$!
    pids+=("$flooder")
    sleep 1
  fi
  # Ahead of the flood's generator on the shared CPU, where the machine allows it.
  local ahead=()
  [[ $EUID -eq 0 ]] && ahead=(nice -n -5)
  line=$("${ahead[@]}" taskset -c 0 ./target/release/examples/paced_client "127.0.0.1:$port" \
    "$RATE" "$DURATION")
  [[ -n "$flooder" ]] && { wait "$flooder" 2>/dev/null || true; }
  echo "$name|$flood|$line" >> "$work/isolation"
  echo "  isolation, $name, flood $flood: $line" >&2
}

nginx_by_address="limit_req_zone \$binary_remote_addr zone=one:10m rate=1r/m;"
nginx_by_address_never="limit_req_zone \$binary_remote_addr zone=one:10m rate=100000000r/s;"
nginx_by_user="limit_req_zone \$http_x_user_id zone=one:10m rate=1r/m;"
# No error-log line per refusal, as operators run it (info is below the error log's level).
refuse="limit_req zone=one; limit_req_log_level info;"
admit="limit_req zone=one burst=1000000 nodelay; limit_req_log_level info;"
one='"per_network"'
three='"per_network", "per_user", "everyone"'
policy refuse1 0 1 "1/h" "$one"
policy refuse3 0 1 "1/h" "$three"
policy admit1 0 1000000000000 "1000000000/s" "$one"
policy admit3 0 1000000000000 "1000000000/s" "$three"
policy per_user 0 1 "1/h" '"per_user"'

: > "$work/cpu"
: > "$work/isolation"
echo "running about $((ROUNDS * (19 * (DURATION + 2) + 4 * DURATION))) s of load..." >&2
for round in $(seq "$ROUNDS"); do
  echo " round $round of $ROUNDS" >&2
  for row in "refused, keep-alive" "admitted, keep-alive" "refused, a connection each" \
    "refused, pipelined"; do
    status=429 zone=$nginx_by_address directives=$refuse one_policy=refuse1 three_policy=refuse3
    extra=()
    case "$row" in
      admitted*) status=200 zone=$nginx_by_address_never directives=$admit
        one_policy=admit1 three_policy=admit3 ;;
      *connection\ each) extra=(-H 'connection: close') ;;
      *pipelined) extra=(-s "$work/pipeline.lua") ;;
    esac
    start_proxy nginx nginx "$zone" "$directives"
    cpu_row "$row" "nginx, 1 limit" "$status" "${extra[@]}"; stop_proxy
    start_proxy tollgate "$one_policy"
    cpu_row "$row" "tollgate, 1 limit" "$status" "${extra[@]}"; stop_proxy
    start_proxy tollgate "$three_policy"
    cpu_row "$row" "tollgate, 3 limits" "$status" "${extra[@]}"; stop_proxy
    if [[ "$status" == 429 ]]; then
      start_proxy floor floor
      cpu_row "$row" "floor: fixed 429 over tokio" "$status" "${extra[@]}"; stop_proxy
    fi
  done
  for flood in no yes; do
    start_proxy nginx nginx "$nginx_by_user" "$refuse"
    isolation_row "nginx" "$flood"; stop_proxy
    start_proxy tollgate per_user
    isolation_row "tollgate" "$flood"; stop_proxy
  done
done

python3 bench/cpu_table.py "$work/cpu" "$ROUNDS"
python3 - "$work/isolation" "$RATE" <<'PY'
import statistics, sys
isolation_file, rate = sys.argv[1], sys.argv[2]
print(f"\nflood isolation: {rate} legitimate requests a second, each under its own key, beside "
      "a flood from one key at wrk's full speed (32 connections) or alone; medians of the rounds\n")
print("| proxy | flood | requests | errors (all rounds) | p50 µs | p99 µs | worst µs |")
print("|---|---|---:|---:|---:|---:|---:|")
runs = {}
for line in open(isolation_file):
    name, flood, text = line.rstrip("\n").split("|")
    words = text.split()
    fields = dict(zip(words[::2], map(int, words[1::2])))
    runs.setdefault((name, flood), []).append(fields)
for (name, flood), measured in runs.items():
    med = lambda key: statistics.median(m[key] for m in measured)
    errors = sum(m["errors"] for m in measured)
    print(f"| {name} | {flood} | {med('requests'):.0f} | {errors} | {med('p50_us'):.0f} | "
          f"{med('p99_us'):.0f} | {max(m['max_us'] for m in measured)} |")
PY
