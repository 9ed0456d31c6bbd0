#!/usr/bin/env bash
# Redis's own cost per decision: the store's decide script (src/limit/decide.lua) called for
# one- to three-bucket requests against a private redis-server, the calls made by Python into
# the RESP protocol and sent by `redis-cli --pipe` (the arguments are binary).
#
#   bench/redis_script.sh                    # µs of Redis CPU per decision (INFO
#                                            # commandstats), redis-server alone on CPU 1
#   bench/redis_script.sh path/to/other.lua  # a variant, for comparison in the same run
#   ARGUMENTS=text bench/redis_script.sh old.lua  # a decide.lua from before 2026-12-03, whose
#                                            # arguments were text (git show 59d8613:src/...)
#   ARGUMENTS=unbanned bench/redis_script.sh old.lua  # one from before bans, whose buckets
#                                            # had no ban rule field (git show 9b454dc:src/...)
#   BAN=1 bench/redis_script.sh              # the first bucket has a ban rule (never refused:
#                                            # its ban key is read, nothing more)
#   ARGUMENTS=u32 bench/redis_script.sh old.lua  # one from before runs, whose requests began
#                                            # with a u32 shape index (git show d8195ab:src/...)
#   BATCH=8 bench/redis_script.sh            # 8 requests on the same buckets per call, as
#                                            # the gateway batches them under load
#   RUNS=1 BATCH=8 bench/redis_script.sh     # the 8 sent as one run of identical requests, as
#                                            # the gateway sends one client's requests in a row
#   BUCKETS=1 bench/redis_script.sh          # one-bucket decisions (1 to 3; default 3)
#   FUNCTION=1 bench/redis_script.sh         # the same script loaded as a Redis function
#                                            # (FUNCTION LOAD) and called with FCALL
#   INSTRUCTIONS=1 bench/redis_script.sh     # redis-server's instructions per call, counted by
#                                            # callgrind: steady where the µs swing with the
#                                            # machine's load
set -euo pipefail
cd "$(dirname "$0")/.."

tools=(redis-server redis-cli taskset python3)
[[ -n "${INSTRUCTIONS:-}" ]] && tools+=(valgrind callgrind_annotate)
for tool in "${tools[@]}"; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench: missing $tool. On Debian: apt-get install redis-server redis-tools util-linux python3 valgrind" >&2
    exit 1
  fi
done

source bench/common.sh

script=${1:-src/limit/decide.lua}
batch=${BATCH:-1}
buckets=${BUCKETS:-3}
if [[ ! "$buckets" =~ ^[1-3]$ ]]; then
  echo "bench: BUCKETS=$buckets: 1, 2 or 3" >&2
  exit 1
fi
if [[ -n "${RUNS:-}" && ( -n "${BAN:-}" || "${ARGUMENTS:-binary}" != binary ) ]]; then
  echo "bench: RUNS=1 needs the current arguments and no BAN (a ban is decided request by request)" >&2
  exit 1
fi

# calls_stream SHA N: N calls in RESP, each of BATCH requests on the same BUCKETS buckets
# (capacity 10^12, 10^9 tokens a second: every request admitted and charged), no deadline.
calls_stream() {
  python3 - "$1" "$2" "$batch" "$buckets" "${ARGUMENTS:-binary}" "${BAN:-}" "${RUNS:-}" \
    "${FUNCTION:+function}" <<'PY'
import struct, sys
sha, calls, batch, buckets, form = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ban, runs = sys.argv[6] == '1', sys.argv[7] == '1'
call = [b'FCALL', b'decide'] if sys.argv[8:] == ['function'] else [b'EVALSHA', sha.encode()]
keys = [b'{bench}per_network:v4:127.0.0.1/32', b'{bench}per_user:h:0fa000000000000000000000000000ff',
        b'{bench}everyone:global'][:buckets]
# Per bucket: capacity, rate, cost, enforce, adaptive factor (0: none), adaptive minimum.
bucket = [1e12, 1e9, 1, 1, 0, 0]
if form in ('binary', 'u32'):
    # Each bucket's doubles, then its ban rule: after (0: none), within and duration (µs).
    rules = [struct.pack('<I2d', 5, 60e6, 900e6) if ban and i == 0 else struct.pack('<I', 0)
             for i in range(buckets)]
    blob = struct.pack('<dII', 0, 1, buckets) + b''.join(struct.pack('<6d', *bucket) + rule for rule in rules)
    # Per request: the shape (and how many requests in a row it stands for), then each bucket's
    # key, the banned bucket's followed by its ban key's.
    indexes = [1] + ([buckets + 1] if ban else []) + list(range(2, buckets + 1))
    keys_of_one = b''.join(struct.pack('<I', i) for i in indexes)
    if form == 'u32':
        blob += (struct.pack('<I', 1) + keys_of_one) * batch
    elif runs:
        blob += struct.pack('<HH', 1, batch) + keys_of_one
    else:
        blob += (struct.pack('<HH', 1, 1) + keys_of_one) * batch
    arguments = [blob]
    if ban:
        keys.append(b'{bench}per_network:v4:127.0.0.1/32|ban')
elif form == 'unbanned':
    blob = struct.pack('<dII', 0, 1, buckets) + struct.pack('<6d', *bucket) * buckets
    blob += (struct.pack('<I', 1) + b''.join(struct.pack('<I', i) for i in range(1, buckets + 1))) * batch
    arguments = [blob]
else:
    arguments = [b'0', b'1', str(buckets).encode()] + [b'%d' % n for n in bucket] * buckets
    arguments += ([b'1'] + [str(i).encode() for i in range(1, buckets + 1)]) * batch
command = call + [str(len(keys)).encode()] + keys + arguments
resp = b'*%d\r\n' % len(command) + b''.join(b'$%d\r\n%s\r\n' % (len(part), part) for part in command)
out = sys.stdout.buffer
for _ in range(calls):
    out.write(resp)
PY
}

# calls N: N calls of BATCH decisions of BUCKETS buckets each, sent from CPU 0.
calls() {
  local sha
  if [[ -n "${FUNCTION:-}" ]]; then
    # The script's body as a function whose parameters bear the names of a script's globals.
    printf '#!lua name=bench\nredis.register_function("decide", function(KEYS, ARGV)\n%s\nend)\n' \
      "$(cat "$script")" | redis-cli -p "$redis_port" -x function load replace >/dev/null
    sha=none
  else
    sha=$(redis-cli -p "$redis_port" script load "$(cat "$script")")
  fi
  calls_stream "$sha" "$1" >"$work/calls"
  taskset -c 0 redis-cli -p "$redis_port" --pipe <"$work/calls" >"$work/pipe.out"
  if ! grep -q 'errors: 0,' "$work/pipe.out"; then
    echo "bench: the script failed:" >&2
    redis-cli -p "$redis_port" evalsha "$sha" 0 >&2 || true
    cat "$work/pipe.out" >&2
    exit 1
  fi
}

if [[ -z "${INSTRUCTIONS:-}" ]]; then
  start_redis taskset -c 1
  calls 200000
  stats=$(redis-cli -p "$redis_port" info commandstats | grep -E '^cmdstat_(evalsha|fcall):')
  per_call=$(grep -o 'usec_per_call=[0-9.]*' <<<"$stats" | cut -d= -f2)
  echo "$script: $(python3 -c "print(f'{$per_call / $batch:.2f}')") µs of Redis CPU per $buckets-bucket decision ($batch per call)"
  exit 0
fi

# Instructions of a whole redis-server run with N calls; the difference of two runs leaves out
# start-up and shutdown.
instructions() {
  local out="$work/callgrind.$1"
  start_redis valgrind --tool=callgrind --callgrind-out-file="$out"
  calls "$1"
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  wait "$redis_pid" || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !seen {gsub(",", "", $1); print $1; seen = 1}'
}
few=$(instructions 1000)
many=$(instructions 11000)
echo "$script: $(((many - few) / 10000 / batch)) redis-server instructions per $buckets-bucket decision ($batch per call)"
