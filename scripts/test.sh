#!/usr/bin/env bash
# The whole test suite on a machine that has the Rust toolchain: finds what the tests need
# (redis-server and redis-cli, promtool, python3 with kubernetes-validate, the openai client,
# mmdb-writer and ja4plus, Chromium, cc, prlimit, nginx and Caddy), installs what is missing
# from Debian's packages and PyPI when it can, says what it does, then runs `cargo test`.
# Arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "test: $* missing and no apt-get here: install them and run again" >&2
    exit 1
  fi
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo)
  fi
  if ((apt_updated == 0)); then
    "${sudo[@]}" apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null
}

# The Redis tests start their own redis-server processes (and a 3-master cluster).
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "test: installing redis-server and redis-tools from Debian"
  apt_install redis-server redis-tools
fi
# The metrics and deployment tests check Prometheus files and /metrics with promtool.
if ! command -v promtool >/dev/null; then
  echo "test: installing prometheus (for promtool) from Debian"
  apt_install prometheus
fi
# The deployment test validates the Kubernetes manifests against their schemas.
if ! command -v python3 >/dev/null; then
  echo "test: installing python3 from Debian"
  apt_install python3 python3-pip
fi
if ! python3 -c "import kubernetes_validate" 2>/dev/null; then
  echo "test: installing kubernetes-validate from PyPI"
  python3 -m pip install --quiet kubernetes-validate 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages kubernetes-validate
fi
# Python packages from PyPI, in a virtual environment of the tests' own: the official openai
# client (settled costs), mmdb-writer (the geoip tests write their MaxMind DB files) and ja4plus
# (the JA4 tests check tollgate's fingerprints against it).
venv=target/test-python
if ! "$venv/bin/python" -c "import openai, mmdb_writer, ja4plus" 2>/dev/null; then
  echo "test: installing openai, mmdb-writer and ja4plus from PyPI into $venv"
  if [[ ! -x "$venv/bin/python" ]] && ! python3 -m venv "$venv" 2>/dev/null; then
    rm -rf "$venv"
    apt_install python3-venv
    python3 -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet openai mmdb-writer ja4plus
fi
# A Redis test preloads a clock-shifting library it builds with cc; an accept test runs the
# gateway under prlimit (util-linux).
if ! command -v cc >/dev/null; then
  echo "test: installing gcc from Debian (a test builds a small preloaded library)"
  apt_install gcc libc6-dev
fi
if ! command -v prlimit >/dev/null; then
  echo "test: installing util-linux from Debian (prlimit)"
  apt_install util-linux
fi
# The decision listener's recipes run with the real peers: nginx (auth_request) and Caddy
# (forward_auth), as the README gives them.
if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
  echo "test: installing nginx from Debian (the decision listener's nginx recipe is run)"
  apt_install nginx
fi
if ! command -v caddy >/dev/null; then
  echo "test: installing caddy from Debian (the decision listener's Caddy recipe is run)"
  apt_install caddy
fi
# The replay report's test opens the HTML report in a headless browser; the JA4 test
# fingerprints the browser's ClientHello.
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  echo "test: installing chromium from Debian (the replay report is checked in a browser)"
  apt_install chromium
fi
echo "test: redis-server $(redis-server --version | grep -o 'v=[^ ]*'), $(promtool --version 2>&1 | head -1)"

exec cargo test --locked "$@"
