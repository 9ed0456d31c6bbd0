# Shared by the benchmark scripts: a scratch directory and process list cleaned up on exit,
# ports, the three-limit policy of rows 4 and 5, and nginx's configurations of rows 2, 3 and 6a.

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

# Waits up to 30 s (a gateway under valgrind starts slowly).
wait_for_port() {
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "bench: nothing listens on port $1" >&2
  exit 1
}

# three_limit_policy PORT ADMIN_PORT UPSTREAM_PORT STORE_SECTION CAPACITY RATE [GLOBAL_EXTRA]
#   [ROUTE_LIMITS]
# A route with a client-network, a header and a global limit (GLOBAL_EXTRA: more of the global
# limit's settings, such as a lease; ROUTE_LIMITS: the quoted names the route applies, all
# three unless given).
three_limit_policy() {
  local all='"per_network", "per_user", "everyone"'
  cat <<CONF
[server]
listen = ["127.0.0.1:$1"]
[admin]
listen = "127.0.0.1:$2"
$4
[upstreams.app]
url = "http://127.0.0.1:$3"
[limits.per_network]
key = "client_network"
capacity = $5
rate = "$6"
[limits.per_user]
key = { header = "x-user-id" }
capacity = $5
rate = "$6"
[limits.everyone]
key = "global"
capacity = $5
rate = "$6"
${7:-}
[[routes]]
name = "bench"
path_prefix = "/"
upstream = "app"
limits = [${8:-$all}]
CONF
}

# nginx_conf DIR PORT UPSTREAM_PORT DIRECTIVES LIMIT_ZONE [TOP_LEVEL] [LISTEN_PARAMETERS]
#   [SERVER_DIRECTIVES]
# nginx with one worker proxying to the upstream over a keep-alive pool; DIRECTIVES go in its
# location, LIMIT_ZONE in http, TOP_LEVEL (such as "master_process off;") at the top,
# LISTEN_PARAMETERS (such as "ssl http2") after the listen address, SERVER_DIRECTIVES (such as
# its certificate) in the server.
nginx_conf() {
  cat <<CONF
worker_processes 1;
daemon off;
${6:-}
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  $5
  upstream app { server 127.0.0.1:$3; keepalive 64; }
  server {
    listen 127.0.0.1:$2 ${7:-};
    ${8:-}
    location / {
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      $4
    }
  }
}
CONF
}

# Row 3: limit_req by client address that never rejects; row 6a: one that refuses nearly all.
# As operators run it: a refusal writes no error-log line (its level, info, is below warn).
nginx_limit_directives="limit_req zone=perip burst=1000000 nodelay; limit_req_log_level info;"
nginx_limit_zone="limit_req_zone \$binary_remote_addr zone=perip:10m rate=100000000r/s;"
nginx_refuse_directives="limit_req zone=one; limit_req_status 429; limit_req_log_level info;"
nginx_refuse_zone="limit_req_zone \$binary_remote_addr zone=one:10m rate=1r/m;"

# whole_numbers NAME=VALUE...: each VALUE a whole number of at least 1, or the script stops.
whole_numbers() {
  for setting in "$@"; do
    if [[ ! "${setting#*=}" =~ ^[1-9][0-9]*$ ]]; then
      echo "bench: $setting is not a whole number of at least 1" >&2
      exit 1
    fi
  done
}

# need_tools TOOL...: each on PATH, or the script stops saying what to install.
need_tools() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "bench: missing $tool (apt-get install wrk util-linux python3)" >&2; exit 1; }
  done
}

# measure_gateway BINARY POLICY PORT [WRK_ARGUMENTS...]: runs BINARY with one worker thread on CPU 1
# with POLICY (listening on PORT), warms it up for 2 s, then drives it with wrk on CPU 0 for
# $DURATION s over $CONNECTIONS connections; prints "requests/s cpu_us_per_request" (the
# gateway's user + system time from /proc/PID/stat) and stops the gateway. With ALSO_PID set
# (a Redis server, say), that process's CPU µs per request over the same seconds follows.
measure_gateway() {
  local binary=$1 policy=$2 port=$3 pid before after output requests rps also_before also=0
  shift 3
  RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 \
    "$binary" --worker-threads 1 run --config "$policy" >/dev/null 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_for_port "$port"
  taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d2s "$@" "http://127.0.0.1:$port/" >/dev/null
  before=$(cpu_ticks "$pid")
  [[ -n "${ALSO_PID:-}" ]] && also_before=$(cpu_ticks "$ALSO_PID")
  output=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "$@" "http://127.0.0.1:$port/")
  after=$(cpu_ticks "$pid")
  [[ -n "${ALSO_PID:-}" ]] && also=$(($(cpu_ticks "$ALSO_PID") - also_before))
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  requests=$(awk '/requests in/ {print $1}' <<<"$output")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$output")
  awk -v r="$rps" -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" \
    -v also="${ALSO_PID:+$also}" \
    'BEGIN {printf "%s %.3f", r, t * 1e6 / hz / n; if (also != "") printf " %.3f", also * 1e6 / hz / n; print ""}'
}

# cpu_ticks PID: the process's user + system time so far, in clock ticks.
cpu_ticks() {
  local stat
  read -r -a stat < "/proc/$1/stat"
  echo $((stat[13] + stat[14]))
}

# busy_ticks CPU: that CPU's busy ticks (all but idle and iowait) and all its ticks, from
# /proc/stat.
busy_ticks() {
  awk -v cpu="cpu$1" '$1 == cpu {print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat
}

# system_ticks PID: the process's system time alone so far, in clock ticks: the kernel's work
# on its sockets, which no change to the proxy's own code takes away.
system_ticks() {
  local stat
  read -r -a stat < "/proc/$1/stat"
  echo "${stat[14]}"
}

# start_fast_upstream: the minimal upstream (examples/fast_upstream, built) on CPU 0, stopped
# on exit; sets upstream_port.
start_fast_upstream() {
  upstream_port=$(free_port)
  taskset -c 0 ./target/release/examples/fast_upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 &
  pids+=($!)
  wait_for_port "$upstream_port"
}

# start_redis [WRAPPER...]: a scratch redis-server (nothing persisted) run by WRAPPER, by
# default `taskset -c 0`, stopped on exit; returns once it answers, and sets redis_port and
# redis_pid.
start_redis() {
  (($#)) || set -- taskset -c 0
  redis_port=$(free_port)
  "$@" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" >/dev/null 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  wait_for_port "$redis_port"
  until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.2; done
}

# start_gateway POLICY PORT: the release gateway with one worker thread on CPU 1, serving
# POLICY (which listens on PORT), stopped on exit; sets gateway (its PID).
start_gateway() {
  RUST_LOG=warn TOLLGATE_HASH_KEY=bench-secret-0123456789 taskset -c 1 \
    ./target/release/tollgate --worker-threads 1 run --config "$1" >/dev/null 2>&1 &
  gateway=$!
  pids+=("$gateway")
  wait_for_port "$2"
}

# gateway_row URL [WRK_ARGUMENTS...]: wrk on CPU 0 against URL for $DURATION s over
# $CONNECTIONS connections; prints "requests/s cpu_us_per_request" of $gateway, or stops the
# script on an answer other than 2xx.
gateway_row() {
  local url=$1 before after output requests
  shift
  before=$(cpu_ticks "$gateway")
  output=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "$@" "$url" 2>&1)
  after=$(cpu_ticks "$gateway")
  if grep -q "Non-2xx" <<<"$output"; then
    echo "bench: answers other than 2xx on $url:" >&2
    echo "$output" >&2
    exit 1
  fi
  requests=$(awk '/requests in/ {print $1}' <<<"$output")
  awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" -v d="$DURATION" \
    'BEGIN {printf "%.0f %.3f\n", n / d, t * 1e6 / hz / n}'
}

# stop_proxy: stops the proxy whose PID is in $proxy (started by a script's start_proxy).
stop_proxy() {
  kill "$proxy" 2>/dev/null || true
  wait "$proxy" 2>/dev/null || true
}

# self_signed_certificate: a certificate for localhost in $work/cert.pem, its key in
# $work/key.pem.
self_signed_certificate() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost" \
    -addext "basicConstraints=critical,CA:FALSE" \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
}

# tls_policy POLICY_FILE: TLS with that certificate on the policy's [server] listeners (its
# first `listen`).
tls_policy() {
  sed -i "0,/^listen = .*/s||&\ntls = { cert = \"$work/cert.pem\", key = \"$work/key.pem\" }|" "$1"
}

# record_cpu_row ROW PROXY_NAME TICKS SYSTEM_TICKS REQUESTS: appends "ROW|PROXY_NAME|requests/s|
# CPU µs per request|of which system µs" over $DURATION s to $work/cpu (what
# bench/cpu_table.py reads), and says it.
record_cpu_row() {
  awk -v row="$1" -v name="$2" -v t="$3" -v s="$4" -v hz="$(getconf CLK_TCK)" -v n="$5" \
    -v d="$DURATION" \
    'BEGIN {printf "%s|%s|%.0f|%.3f|%.3f\n", row, name, n / d, t * 1e6 / hz / n, s * 1e6 / hz / n}' \
    >> "$work/cpu"
  echo "  $1, $2: $(tail -n 1 "$work/cpu" | cut -d'|' -f3-)" >&2
}
