-- Gives back what decide.lua charged, for a request that another slot refused (Redis
-- Cluster). Tokens are recomputed at the server's time, the cost added back, capped at the
-- capacity.
--
-- KEYS[i]: the bucket keys. ARGV: per bucket, 3 values: capacity, rate, cost. A calendar
-- quota (rate 0) gets its cost back in its period's count, which keeps its expiry.
-- State: decide.lua's one string of little-endian doubles per bucket (tokens, then ts or a
-- quota's period, then any adaptive state, kept as it is).

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

for i = 1, #KEYS do
  local base = (i - 1) * 3
  local capacity = tonumber(ARGV[base + 1])
  local rate = tonumber(ARGV[base + 2])
  local cost = tonumber(ARGV[base + 3])
  local stored = redis.pcall('GET', KEYS[i])
  if type(stored) == 'string' and #stored >= 16 then
    local tokens, second = struct.unpack('<dd', stored)
    local rest = string.sub(stored, 17)
    if rate == 0 then
      local current = math.min(capacity, tokens + cost)
      redis.call('SET', KEYS[i], struct.pack('<dd', current, second) .. rest, 'KEEPTTL')
    else
      local elapsed = math.max(0, now - second) / 1000000
      -- A bucket's moment only moves forward: behind the stored one, nothing refills.
      local moment = math.max(now, second)
      local current = math.min(capacity, tokens + elapsed * rate + cost)
      if current >= capacity and rest == '' then
        redis.call('DEL', KEYS[i])
      else
        -- An adaptive key's expiry also covers its penalty: it is kept.
        local refill_ms = math.ceil(((capacity - current) / rate * 1000000 + moment - now) / 1000)
        if rest ~= '' then
          redis.call('SET', KEYS[i], struct.pack('<dd', current, moment) .. rest, 'KEEPTTL')
        else
          redis.call('SET', KEYS[i], struct.pack('<dd', current, moment), 'PX',
            string.format('%d', math.min(refill_ms, 315360000000) + 1000))
        end
      end
    end
  end
end
return #KEYS
