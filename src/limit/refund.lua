-- Gives back what decide.lua charged, for a request that another slot refused (Redis
-- Cluster). Tokens are recomputed at the server's time, the cost added back, capped at the
-- capacity.
--
-- KEYS[i]: the bucket keys. ARGV: per bucket, 3 values: capacity, rate, cost. A calendar
-- quota (rate 0) gets its cost back in its period's count, which keeps its expiry.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

for i = 1, #KEYS do
  local base = (i - 1) * 3
  local capacity = tonumber(ARGV[base + 1])
  local rate = tonumber(ARGV[base + 2])
  local cost = tonumber(ARGV[base + 3])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  if rate == 0 then
    if state[1] then
      local current = math.min(capacity, tonumber(state[1]) + cost)
      redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', current))
    end
  elseif state[1] and state[2] then
    local elapsed = math.max(0, now - tonumber(state[2])) / 1000000
    local current = math.min(capacity, tonumber(state[1]) + elapsed * rate + cost)
    if current >= capacity then
      redis.call('DEL', KEYS[i])
    else
      redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', current), 'ts', string.format('%d', now))
      local refill_ms = math.ceil((capacity - current) / rate * 1000)
      redis.call('PEXPIRE', KEYS[i], string.format('%d', math.min(refill_ms, 315360000000) + 1000))
    end
  end
end
return #KEYS
