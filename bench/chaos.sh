#!/usr/bin/env bash
# A bounded chaos run (examples/chaos.rs): three replicas on one redis-server under load for
# SECONDS_TO_RUN (default 60) while Redis is paused, stopped, killed and restarted, the upstream
# is killed and restarted, and every replica reloads its policy once a second. Prints requests
# by status, the longest request, panics, admitted versus allowed, and RSS; fails on a panic or
# an over-admission. Needs redis-server and redis-cli; loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing (Debian package redis-server)" >&2; exit 1; }
done
cargo build --release --quiet --bin tollgate --example fast_upstream --example chaos
./target/release/examples/chaos ./target/release/tollgate ./target/release/examples/fast_upstream "${SECONDS_TO_RUN:-60}"
