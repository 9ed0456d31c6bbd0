#!/usr/bin/env bash
# Differential runs on generated input, loopback only, bounded by CASES: the two HTTP/1.1
# server paths on request heads (tests/http1_differential.rs: a gateway with [server] http1 =
# "fast" and one with "hyper"), then the own upstream client and hyper's on response heads
# (tests/upstream_differential.rs). Prints the outcome counts and the first disagreements.
#
#   bench/fuzz.sh                 # 1,000,000 cases, seed 1
#   CASES=100000 SEED=7 bench/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export TOLLGATE_DIFFERENTIAL_CASES="${CASES:-1000000}"
export TOLLGATE_DIFFERENTIAL_SEED="${SEED:-1}"
echo "fuzz: $TOLLGATE_DIFFERENTIAL_CASES cases, seed $TOLLGATE_DIFFERENTIAL_SEED (release build)"
started=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for test in http1_differential upstream_differential; do
    cargo test --release --locked --test "$test" -- --nocapture >"$log" 2>&1 || status=1
    sed -n -e '/cases (seed/p' -e '/disagree/,/^stack backtrace/p' -e '/^test result/p' "$log"
done
echo "fuzz: $(( $(date +%s) - started )) s"
exit "$status"
