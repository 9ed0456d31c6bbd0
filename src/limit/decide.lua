-- All of one request's buckets (in one slot), decided in one indivisible step.
--
-- KEYS[i]: the bucket keys.
-- ARGV: per bucket, 6 values: capacity, rate (tokens per second), cost, enforce (1/0),
--   factor and min_capacity of the limit's adaptive penalty (factor '0': not adaptive).
-- State per bucket: a hash {tokens, ts} where ts is the Redis server's time in microseconds,
-- plus, for keys of adaptive limits, {level, hold, errors, keep} written by outcome.lua.
-- The time is the server's (TIME), so replicas with skewed clocks agree.
--
-- A penalised key's capacity and rate are multiplied by factor^level (never below
-- min_capacity) until `hold`. Admitted only if every enforcing bucket holds its cost; then
-- every bucket that can pay is charged. A bucket is written only when charged (refill is lazy:
-- an unwritten bucket keeps meaning the same thing) and expires once it would be full again
-- and its adaptive state no longer matters.
--
-- Reply: one string "admitted tokens_1 sufficient_1 multiplier_1 ..." (numbers as text: Redis
-- would truncate Lua numbers to integers; one string is one bulk reply to parse).
--
-- This runs inside Redis for every request, so it is written for Redis's CPU: library
-- functions held in locals, comparisons instead of math.min/max calls, one table for all
-- buckets' numbers instead of one per quantity, and strings from Redis used in arithmetic
-- as they are (Lua converts them, as tonumber would). Each of these showed in instruction
-- counts of redis-server.

local call, tonumber, format, ceil = redis.call, tonumber, string.format, math.ceil
local clock = call('TIME')
local now = clock[1] * 1000000 + clock[2]

local count = #KEYS
-- Per bucket, from (i - 1) * 6: tokens now, capacity, rate, multiplier, cost, keep (until
-- when its adaptive state matters).
local state, sufficient = {}, {}
local admitted = true
for i = 1, count do
  local base = (i - 1) * 6
  local capacity = tonumber(ARGV[base + 1])
  local rate = tonumber(ARGV[base + 2])
  local cost = tonumber(ARGV[base + 3])
  local stored
  local multiplier, keep = 1, 0
  if ARGV[base + 5] ~= '0' then
    stored = call('HMGET', KEYS[i], 'tokens', 'ts', 'level', 'hold', 'keep')
    local level = tonumber(stored[3]) or 0
    if level > 0 and now < (tonumber(stored[4]) or 0) then
      local floor = tonumber(ARGV[base + 6]) / capacity
      if floor > 1 then floor = 1 end
      multiplier = tonumber(ARGV[base + 5]) ^ level
      if multiplier < floor then multiplier = floor end
    end
    keep = tonumber(stored[5]) or 0
    capacity = capacity * multiplier
    rate = rate * multiplier
  else
    -- Not adaptive: the penalty fields are never written, so only these two are read.
    stored = call('HMGET', KEYS[i], 'tokens', 'ts')
  end
  local current = capacity
  if stored[1] and stored[2] then
    local elapsed = now - stored[2]
    if elapsed < 0 then elapsed = 0 end
    current = stored[1] + elapsed / 1000000 * rate
    if current > capacity then current = capacity end
  end
  state[base + 1], state[base + 2], state[base + 3] = current, capacity, rate
  state[base + 4], state[base + 5], state[base + 6] = multiplier, cost, keep
  sufficient[i] = current >= cost
  if not sufficient[i] and ARGV[base + 4] == '1' then
    admitted = false
  end
end

-- string.format costs more than a redis.call here: each number is spelled once, and the
-- usual multiplier of 1 not at all.
local now_text = format('%d', now)
local reply = { admitted and '1' or '0' }
for i = 1, count do
  local base = (i - 1) * 6
  local tokens = state[base + 1]
  local charged = admitted and sufficient[i]
  if charged then
    tokens = tokens - state[base + 5]
  end
  local spelled = format('%.17g', tokens)
  if charged then
    call('HSET', KEYS[i], 'tokens', spelled, 'ts', now_text)
    local expire_ms = ceil((state[base + 2] - tokens) / state[base + 3] * 1000)
    local keep_ms = ceil((state[base + 6] - now) / 1000)
    if keep_ms > expire_ms then expire_ms = keep_ms end
    if expire_ms > 315360000000 then expire_ms = 315360000000 end
    call('PEXPIRE', KEYS[i], format('%d', expire_ms + 1000))
  end
  local multiplier = state[base + 4]
  reply[3 * i - 1] = spelled
  reply[3 * i] = sufficient[i] and '1' or '0'
  reply[3 * i + 1] = multiplier == 1 and '1' or format('%.17g', multiplier)
end
return table.concat(reply, ' ')
