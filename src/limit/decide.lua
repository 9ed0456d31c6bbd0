-- All of one request's buckets (in one slot), decided in one indivisible step.
--
-- KEYS[i]: the bucket keys.
-- ARGV: per bucket, 4 values: capacity, rate (tokens per second), cost, enforce (1/0).
-- State per bucket: a hash {tokens, ts} where ts is the Redis server's time in microseconds.
-- The time is the server's (TIME), so replicas with skewed clocks agree.
--
-- Admitted only if every enforcing bucket holds its cost; then every bucket that can pay is
-- charged. A bucket is written only when charged (refill is lazy: an unwritten bucket keeps
-- meaning the same thing) and expires once it would be full again.
--
-- Reply: {admitted, tokens_1, sufficient_1, tokens_2, sufficient_2, ...}, all strings
-- (Redis would truncate Lua numbers to integers).

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local count = #KEYS
local tokens = {}
local sufficient = {}
local admitted = true
for i = 1, count do
  local base = (i - 1) * 4
  local capacity = tonumber(ARGV[base + 1])
  local rate = tonumber(ARGV[base + 2])
  local cost = tonumber(ARGV[base + 3])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local current = capacity
  if state[1] and state[2] then
    local elapsed = math.max(0, now - tonumber(state[2])) / 1000000
    current = math.min(capacity, tonumber(state[1]) + elapsed * rate)
  end
  tokens[i] = current
  sufficient[i] = current >= cost
  if not sufficient[i] and ARGV[base + 4] == '1' then
    admitted = false
  end
end

local reply = { admitted and '1' or '0' }
for i = 1, count do
  local base = (i - 1) * 4
  local capacity = tonumber(ARGV[base + 1])
  local rate = tonumber(ARGV[base + 2])
  local cost = tonumber(ARGV[base + 3])
  if admitted and sufficient[i] then
    tokens[i] = tokens[i] - cost
    redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', tokens[i]), 'ts', string.format('%d', now))
    local refill_ms = math.ceil((capacity - tokens[i]) / rate * 1000)
    redis.call('PEXPIRE', KEYS[i], string.format('%d', math.min(refill_ms, 315360000000) + 1000))
  end
  reply[#reply + 1] = string.format('%.17g', tokens[i])
  reply[#reply + 1] = sufficient[i] and '1' or '0'
end
return reply
