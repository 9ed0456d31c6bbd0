#!/usr/bin/env bash
# The whole test suite on a machine that has the Rust toolchain: finds what the tests need
# (redis-server and redis-cli, promtool, python3 with kubernetes-validate, the openai client,
# mmdb-writer and ja4plus, Chromium, cc, prlimit, openssl, nginx, Caddy, HAProxy and pebble),
# installs what is missing from Debian's packages and PyPI when it can, says what it does, then
# runs `cargo test`.
# Arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "test: cargo is not on PATH: install the Rust toolchain (https://rustup.rs), then run this again" >&2
  exit 1
fi

# What is missing is found first, said, and then installed from Debian in one go.
packages=()
need() {
  local why=$1
  shift
  echo "test: missing $why: will install $* from Debian"
  packages+=("$@")
}
have() { command -v "$1" >/dev/null; }

# The Redis tests start their own redis-server processes (and a 3-master cluster).
have redis-server && have redis-cli || need "redis-server and redis-cli" redis-server redis-tools
# The metrics and deployment tests check Prometheus files and /metrics with promtool.
have promtool || need promtool prometheus
# The deployment test validates the Kubernetes manifests (kubernetes-validate, from PyPI); the
# tests' own Python packages live in a virtual environment.
have python3 || need python3 python3
if ! have python3 || ! python3 -m pip --version >/dev/null 2>&1; then
  need "python3's pip" python3-pip
fi
if ! have python3 || ! python3 -c "import ensurepip, venv" 2>/dev/null; then
  need "python3's venv" python3-venv
fi
# A Redis test preloads a clock-shifting library it builds with cc; an accept test runs the
# gateway under prlimit (util-linux).
have cc || need "a C compiler (a test builds a small preloaded library)" gcc libc6-dev
have prlimit || need prlimit util-linux
# The decision listener's recipes run with the real peers: nginx (auth_request) and Caddy
# (forward_auth), as the docs give them.
have nginx || [[ -x /usr/sbin/nginx ]] || need "nginx (its auth_request recipe is run)" nginx
have caddy || need "caddy (its forward_auth recipe is run)" caddy
# HAProxy sends PROXY v2 headers (and health checks) in front of a gateway.
have haproxy || [[ -x /usr/sbin/haproxy ]] || need "haproxy (it sends PROXY headers to the gateway)" haproxy
# The TLS tests make a private CA and certificates with openssl; pebble is a real ACME server.
have openssl || need "openssl (the TLS tests make their certificates with it)" openssl
have pebble && have pebble-challtestsrv || need "pebble (a real ACME server on loopback)" pebble
# The replay report's test opens the HTML report in a headless browser; the JA4 test
# fingerprints the browser's ClientHello.
have chromium || have chromium-browser || need "chromium (the replay report is checked in a browser)" chromium

if ((${#packages[@]} > 0)); then
  if ! have apt-get; then
    echo "test: no apt-get here: install ${packages[*]} (or their equivalents) and run again" >&2
    exit 1
  fi
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! have sudo; then
      echo "test: not root and no sudo: install ${packages[*]} as root, then run this again" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
fi

if ! python3 -c "import kubernetes_validate" 2>/dev/null; then
  echo "test: installing kubernetes-validate from PyPI"
  python3 -m pip install --quiet kubernetes-validate 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages kubernetes-validate
fi
# Python packages from PyPI, in a virtual environment of the tests' own: the official openai
# client (settled costs), mmdb-writer (the geoip tests write their MaxMind DB files), ja4plus
# (the JA4 tests check tollgate's fingerprints against it), grpcio with opentelemetry-proto (the
# OTLP receiver of the trace tests) and aioquic (the HTTP/3 client).
venv=target/test-python
if ! "$venv/bin/python" -c "import openai, mmdb_writer, ja4plus, grpc, opentelemetry.proto, aioquic" 2>/dev/null; then
  echo "test: installing openai, mmdb-writer, ja4plus, grpcio, opentelemetry-proto and aioquic from PyPI into $venv"
  [[ -x "$venv/bin/python" ]] || { rm -rf "$venv" && python3 -m venv "$venv"; }
  "$venv/bin/python" -m pip install --quiet openai mmdb-writer ja4plus grpcio opentelemetry-proto aioquic
fi
echo "test: redis-server $(redis-server --version | grep -o 'v=[^ ]*'), $(promtool --version 2>&1 | head -1)"

exec cargo test --locked "$@"
