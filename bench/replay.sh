#!/usr/bin/env bash
# `tollgate replay` speed: a generated JSON access log of LINES lines (default 10^6) replayed
# against bench/replay.toml (three limits on the API route), one thread, over rounds; beside
# it, what `cat` takes to read the same file into /dev/null (warm, the file in the page cache).
#
#   bench/replay.sh                      # 10^6 lines, 3 rounds
#   BENCH_LINES=2000000 BENCH_ROUNDS=5 bench/replay.sh
#   BENCH_FORMAT=combined bench/replay.sh     # the same requests as a combined log
#   BENCH_FORMAT=nginx bench/replay.sh        # the combined log read through --format nginx:'…'
set -euo pipefail
cd "$(dirname "$0")/.."

LINES=${BENCH_LINES:-1000000}
ROUNDS=${BENCH_ROUNDS:-3}
FORMAT=${BENCH_FORMAT:-json}
case $FORMAT in
  json) generated=json format=(--format json) ;;
  combined) generated=combined format=(--format combined) ;;
  nginx)
    generated=combined
    format=(--format 'nginx:$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"')
    ;;
  *) echo "bench: BENCH_FORMAT is json, combined or nginx" >&2; exit 1 ;;
esac

echo "building release binaries..." >&2
cargo build --release --quiet --bin tollgate --example replay_log

source bench/common.sh

log="$work/access.log"
./target/release/examples/replay_log "$LINES" "$generated" > "$log"
bytes=$(stat -c %s "$log")
cat "$log" > /dev/null # into the page cache

seconds() { # COMMAND...: wall seconds of one run
  local start end
  start=$(date +%s.%N)
  "$@" > /dev/null
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l
}

replays=() cats=()
for round in $(seq 1 "$ROUNDS"); do
  cats+=("$(seconds cat "$log")")
  replays+=("$(seconds taskset -c 1 ./target/release/tollgate replay --config bench/replay.toml "${format[@]}" "$log")")
  echo "round $round: cat ${cats[-1]} s, replay ${replays[-1]} s" >&2
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }
replay_median=$(median "${replays[@]}")
cat_median=$(median "${cats[@]}")
printf 'log: %d lines, %d MB\n' "$LINES" $((bytes / 1000000))
replay_best=$(printf '%s\n' "${replays[@]}" | sort -g | head -1)
printf 'replay: median %.3f s (range %s s): %.0f lines/s on one core (best round %.0f)\n' \
  "$replay_median" "$(range "${replays[@]}")" "$(echo "$LINES / $replay_median" | bc -l)" \
  "$(echo "$LINES / $replay_best" | bc -l)"
printf 'cat:    median %.3f s (range %s s): %.0f lines/s\n' \
  "$cat_median" "$(range "${cats[@]}")" "$(echo "$LINES / $cat_median" | bc -l)"
printf 'replay takes %.1f× as long as cat\n' "$(echo "$replay_median / $cat_median" | bc -l)"
./target/release/tollgate replay --config bench/replay.toml "${format[@]}" "$log" | head -12
