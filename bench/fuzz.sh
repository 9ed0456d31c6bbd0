#!/usr/bin/env bash
# Differential run of the two HTTP/1.1 server paths on generated request heads (see
# tests/http1_differential.rs): a gateway with [server] http1 = "fast" and one with "hyper",
# the same cases to both, every disagreement printed. Loopback only; bounded by CASES.
#
#   bench/fuzz.sh                 # 1,000,000 cases, seed 1
#   CASES=100000 SEED=7 bench/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export TOLLGATE_DIFFERENTIAL_CASES="${CASES:-1000000}"
export TOLLGATE_DIFFERENTIAL_SEED="${SEED:-1}"
echo "fuzz: $TOLLGATE_DIFFERENTIAL_CASES cases, seed $TOLLGATE_DIFFERENTIAL_SEED (release build)"
started=$(date +%s)
cargo test --release --locked --test http1_differential -- --nocapture 2>&1 |
    grep -E "cases \(seed|disagree|^case |^  (fast|hyper):|test result"
echo "fuzz: $(( $(date +%s) - started )) s"
