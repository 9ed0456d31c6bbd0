#!/usr/bin/env bash
# User-space instructions per proxied request, counted by callgrind: the row-4 setup (memory
# store, one worker thread, three limits that never reject) under a fixed load. Unlike time,
# the count does not move with whatever else the machine is doing, so it shows what a change
# to the hot path is worth.
#
#   bench/instructions.sh            # the count
#   TOP=40 bench/instructions.sh     # and the 40 functions with the most instructions (inclusive)
#   STORE=redis bench/instructions.sh    # row 5: the Redis store (starts its own redis-server)
#   REFUSING=1 bench/instructions.sh     # row 6b: every request refused (429)
#   ONE_LIMIT=1 bench/instructions.sh    # the client-network limit alone, as nginx's one limit_req
#   MORE_FIELDS=1 bench/instructions.sh  # six more non-standard header fields per request
#   CLOSE=1 bench/instructions.sh        # `Connection: close`: a TCP connection per request
#   CONN_REFUSED=1 bench/instructions.sh # every connection refused by [server.connections] as
#                                        # it is accepted (the count is per refused connection)
#   UPSTREAM_KEEP_ALIVE=1 bench/instructions.sh  # the upstream answers `Connection: keep-alive`
#   H2=1 bench/instructions.sh           # HTTP/2 with prior knowledge (h2c), sent by h2load
#   TLS=1 bench/instructions.sh          # over TLS 1.3 (with H2=1: HTTP/2 chosen by ALPN)
#   JWT=claim bench/instructions.sh      # every request carries an RS256 bearer token, and the
#                                        # per-user limit is keyed by its verified `sub`;
#                                        # JWT=header: the same token, the limit keyed by header
#   DECISION=1 bench/instructions.sh     # the same limits asked about by forward-auth sub-requests
#                                        # to the decision listener (REFUSING=1: refused ones)
#   TRACING=0.01 bench/instructions.sh   # [tracing] with this sample_ratio, spans exported over
#                                        # gRPC to the tests' OTLP receiver (on CPU 0)
#   KEYS_PER_LIMIT=0 bench/instructions.sh   # [top] keys_per_limit (default 1000; 0: top keys off)
#   OVERRIDE=1 bench/instructions.sh     # the per-user limit's key under an operator's override
#                                        # (the limit's own numbers, set through /overrides)
#   PROXY=nginx bench/instructions.sh    # nginx with limit_req (row 3) under the same load, for a
#                                        # ratio that does not swing; with REFUSING=1: row 6a
#   DUMP=/tmp/x.callgrind bench/instructions.sh   # and keep callgrind's profile there, for
#                                                 # callgrind_annotate (exclusive costs, lines)
set -euo pipefail
cd "$(dirname "$0")/.."

proxy=${PROXY:-tollgate}
if [[ "$proxy" != tollgate && "$proxy" != nginx ]]; then
  echo "bench: PROXY is tollgate or nginx, not $proxy" >&2
  exit 1
fi
optional=()
[[ -n "${STORE:-}" ]] && optional+=(redis-server redis-cli)
[[ "$proxy" == nginx ]] && optional+=(nginx)
[[ -n "${OVERRIDE:-}${CONN_REFUSED:-}" ]] && optional+=(curl)
[[ -n "${H2:-}" ]] && optional+=(h2load)
[[ -n "${TLS:-}" ]] && optional+=(openssl)
for tool in wrk valgrind callgrind_control python3 taskset "${optional[@]}"; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench: missing $tool. On Debian: apt-get install wrk valgrind python3 redis-server nginx-light" >&2
    exit 1
  fi
done

cargo build --release --quiet --bin tollgate --example fast_upstream --example sign_token

source bench/common.sh

upstream_port=$(free_port)
# As in bench/run.sh: load generator and upstream on CPU 0, the gateway on CPU 1. How requests
# batch up depends on it, and with that the count.
taskset -c 0 ./target/release/examples/fast_upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 &
pids+=($!)
wait_for_port "$upstream_port"

store_section=""
if [[ "${STORE:-memory}" == redis ]]; then
  start_redis
  # Under callgrind the gateway runs some 30 times slower: with the default 50 ms, calls would
  # time out, the circuit would open, and requests would skip Redis (and the count with them).
  store_section="[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$redis_port\"
timeout = \"10s\""
fi
if [[ -n "${REFUSING:-}" ]]; then
  limits=(1 "1/h")
else
  limits=(1000000000000 "1000000000/s")
fi

# The token (and the key set that verifies it) for JWT=...
token=$(./target/release/examples/sign_token "$work/jwks.json")

port=$(free_port)
listen_parameters="" server_directives=""
if [[ -n "${H2:-}" ]]; then
  # h2load does not reconnect, and nginx ends a connection after 1,000 requests by default.
  listen_parameters="http2" server_directives="keepalive_requests 100000000;"
fi
if [[ -n "${TLS:-}" ]]; then
  self_signed_certificate
  listen_parameters="ssl $listen_parameters"
  server_directives+=" ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem;"
fi
callgrind=(valgrind --tool=callgrind --compress-strings=no --compress-pos=no
  --callgrind-out-file="$work/callgrind.%p")
if [[ "$proxy" == nginx ]]; then
  if [[ -n "${REFUSING:-}" ]]; then
    directives=$nginx_refuse_directives zone=$nginx_refuse_zone
  else
    directives=$nginx_limit_directives zone=$nginx_limit_zone
  fi
  # One process that serves requests itself, so that callgrind sees the work.
  nginx_conf "$work" "$port" "$upstream_port" "$directives" "$zone" "master_process off;" \
    "$listen_parameters" "$server_directives" > "$work/nginx.conf"
  taskset -c 1 "${callgrind[@]}" nginx -p "$work" -c "$work/nginx.conf" \
    >/dev/null 2>"$work/valgrind.log" &
else
  admin=$(free_port)
  route_limits=()
  [[ -n "${ONE_LIMIT:-}" ]] && route_limits=("" '"per_network"')
  three_limit_policy "$port" "$admin" "$upstream_port" "$store_section" "${limits[@]}" \
    "${route_limits[@]}" > "$work/policy.toml"
  [[ -n "${TLS:-}" ]] && tls_policy "$work/policy.toml"
  if [[ -n "${CONN_REFUSED:-}" ]]; then
    printf '[server.connections]\nper_network = { capacity = 1, rate = "1/h" }\n' >> "$work/policy.toml"
  fi
  if [[ -n "${DECISION:-}" ]]; then
    decision_port=$(free_port)
    printf '[decision]\nlisten = "127.0.0.1:%s"\n' "$decision_port" >> "$work/policy.toml"
  fi
  if [[ -n "${KEYS_PER_LIMIT:-}" ]]; then
    printf '[top]\nkeys_per_limit = %s\n' "$KEYS_PER_LIMIT" >> "$work/policy.toml"
  fi
  if [[ -n "${TRACING:-}" ]]; then
    # The receiver binds ports of its own choosing and names them on its first line.
    taskset -c 0 target/test-python/bin/python tests/fixtures/otlp_receiver.py \
      > "$work/receiver.out" 2>/dev/null &
    pids+=($!)
    until [[ -s "$work/receiver.out" ]]; do sleep 0.1; done
    collector=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["grpc"])' \
      < "$work/receiver.out")
    printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nsample_ratio = %s\n' \
      "$collector" "$TRACING" >> "$work/policy.toml"
  fi
  if [[ "${JWT:-}" == claim ]]; then
    sed -i 's|key = { header = "x-user-id" }|key = { jwt_claim = "sub" }|' "$work/policy.toml"
    printf '[auth.jwt]\njwks_file = "%s"\n' "$work/jwks.json" >> "$work/policy.toml"
  fi
  RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 "${callgrind[@]}" \
    ./target/release/tollgate --worker-threads 1 run --config "$work/policy.toml" \
    >/dev/null 2>"$work/valgrind.log" &
fi
gateway=$!
pids+=("$gateway")
wait_for_port "$port"
if [[ -n "${OVERRIDE:-}" ]]; then
  wait_for_port "$admin"
  curl -fsS -X PUT --data "{\"capacity\": ${limits[0]}, \"rate\": \"${limits[1]}\"}" \
    "http://127.0.0.1:$admin/overrides/per_user?key=bench-user" >/dev/null
fi

fields=(-H 'x-user-id: bench-user')
if [[ -n "${MORE_FIELDS:-}" ]]; then
  # What a browser's fetch adds, none of them among `http`'s standard names.
  fields+=(-H 'sec-fetch-site: same-origin' -H 'sec-fetch-mode: cors' -H 'sec-fetch-dest: empty'
    -H 'sec-ch-ua-platform: Linux' -H 'x-requested-with: XMLHttpRequest'
    -H 'x-client-version: 1.2.3')
fi
if [[ -n "${CLOSE:-}" ]]; then
  fields+=(-H 'connection: close')
fi
if [[ -n "${JWT:-}" ]]; then
  fields+=(-H "authorization: Bearer $token")
fi
url="http://127.0.0.1:$port/"
[[ -n "${TLS:-}" ]] && url="https://127.0.0.1:$port/"
[[ -n "${UPSTREAM_KEEP_ALIVE:-}" ]] && url+="keep-alive"
if [[ -n "${DECISION:-}" ]]; then
  url="http://127.0.0.1:$decision_port/decide"
  fields+=(-H 'x-forwarded-method: GET' -H 'x-forwarded-uri: /' -H 'x-forwarded-for: 127.0.0.1')
fi
load() {
  if [[ -n "${H2:-}" ]]; then
    # Eight connections of four streams at a time: the same eight connections as wrk's.
    taskset -c 0 h2load -c8 -m4 -D "${1%s}" "${fields[@]}" "$url"
  else
    taskset -c 0 wrk -t1 -c8 -d"$1" "${fields[@]}" "$url"
  fi
}
# Connections refused by [server.connections], from the gateway's own count.
refused_connections() {
  curl -fsS "http://127.0.0.1:$admin/metrics" |
    awk '/^tollgate_connections_refused_total\{reason="rate"\}/ {print $2}'
}
load 3s >/dev/null # warm-up: connections, pools, caches
[[ -n "${CONN_REFUSED:-}" ]] && refused_before=$(refused_connections)
callgrind_control --zero "$gateway" >/dev/null
[[ -n "$store_section" ]] && redis-cli -p "$redis_port" config resetstat >/dev/null
output=$(load 8s)
callgrind_control --dump "$gateway" >/dev/null
requests=$(awk '/requests in/ {print $1} /^requests:/ {print $6}' <<<"$output")
if [[ -n "${CONN_REFUSED:-}" ]]; then
  requests=$(($(refused_connections) - refused_before))
  echo "$requests connections refused as accepted"
fi
if [[ -n "$store_section" ]]; then
  # The count depends on how many decisions share a script call (a call's work is shared by
  # its batch), which depends on how fast the gateway runs: say it with the count.
  calls=$(redis-cli -p "$redis_port" info commandstats | grep -o 'cmdstat_evalsha:calls=[0-9]*' |
    cut -d= -f2)
  awk -v calls="${calls:-0}" -v n="$requests" \
    'BEGIN {if (calls > 0) printf "%.1f requests per Redis script call\n", n / calls}'
fi
if [[ -n "${DUMP:-}" ]]; then
  cp "$(ls "$work"/callgrind.*.1 | tail -n 1)" "$DUMP"
fi

python3 - "$work" "$requests" "${TOP:-0}" "$proxy" <<'PY'
import collections, glob, sys
work, requests, top, proxy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
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
print(f"{proxy}: {requests} requests, {total / requests:,.0f} user-space instructions per request")
for name, cost in inclusive.most_common(top):
    print(f"{cost / requests:10,.0f}  {name[:150]}")
PY
