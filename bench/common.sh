# Shared by the benchmark scripts: a scratch directory and process list cleaned up on exit,
# ports, and the three-limit policy of rows 4 and 5.

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

# three_limit_policy PORT ADMIN_PORT UPSTREAM_PORT STORE_SECTION CAPACITY RATE
# A route with a client-network, a header and a global limit.
three_limit_policy() {
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
[[routes]]
name = "bench"
path_prefix = "/"
upstream = "app"
limits = ["per_network", "per_user", "everyone"]
CONF
}
