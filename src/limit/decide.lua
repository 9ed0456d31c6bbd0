-- All of one request's buckets (in one slot), decided in one indivisible step.
--
-- KEYS[i]: the bucket keys.
-- ARGV: per bucket, 6 values: capacity, rate (tokens per second), cost, enforce (1/0),
--   factor and min_capacity of the limit's adaptive penalty (factor 0: not adaptive).
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

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local count = #KEYS
local tokens, sufficient, capacities, rates, multipliers, keep, costs = {}, {}, {}, {}, {}, {}, {}
local admitted = true
for i = 1, count do
  local base = (i - 1) * 6
  local capacity = tonumber(ARGV[base + 1])
  local rate = tonumber(ARGV[base + 2])
  local cost = tonumber(ARGV[base + 3])
  costs[i] = cost
  local factor = tonumber(ARGV[base + 5])
  local state
  local multiplier = 1
  if factor > 0 then
    state = redis.call('HMGET', KEYS[i], 'tokens', 'ts', 'level', 'hold', 'keep')
    local level = tonumber(state[3]) or 0
    if level > 0 and now < (tonumber(state[4]) or 0) then
      local floor = math.min(1, tonumber(ARGV[base + 6]) / capacity)
      multiplier = math.max(factor ^ level, floor)
    end
  else
    -- Not adaptive: the penalty fields are never written, so only these two are read.
    state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  end
  capacity = capacity * multiplier
  rate = rate * multiplier
  local current = capacity
  if state[1] and state[2] then
    local elapsed = math.max(0, now - tonumber(state[2])) / 1000000
    current = math.min(capacity, tonumber(state[1]) + elapsed * rate)
  end
  tokens[i], capacities[i], rates[i], multipliers[i] = current, capacity, rate, multiplier
  keep[i] = tonumber(state[5]) or 0
  sufficient[i] = current >= cost
  if not sufficient[i] and ARGV[base + 4] == '1' then
    admitted = false
  end
end

-- string.format costs more than a redis.call here: each number is spelled once, and the
-- usual multiplier of 1 not at all.
local now_text = string.format('%d', now)
local reply = { admitted and '1' or '0' }
for i = 1, count do
  if admitted and sufficient[i] then
    tokens[i] = tokens[i] - costs[i]
  end
  local spelled = string.format('%.17g', tokens[i])
  if admitted and sufficient[i] then
    redis.call('HSET', KEYS[i], 'tokens', spelled, 'ts', now_text)
    local refill_ms = math.ceil((capacities[i] - tokens[i]) / rates[i] * 1000)
    local keep_ms = math.ceil((keep[i] - now) / 1000)
    redis.call('PEXPIRE', KEYS[i], string.format('%d', math.min(math.max(refill_ms, keep_ms), 315360000000) + 1000))
  end
  reply[#reply + 1] = spelled
  reply[#reply + 1] = sufficient[i] and '1' or '0'
  reply[#reply + 1] = multipliers[i] == 1 and '1' or string.format('%.17g', multipliers[i])
end
return table.concat(reply, ' ')
