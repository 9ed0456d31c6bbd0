-- After the upstream answered: extra charges by status (charge_on_status) and errors for
-- adaptive penalties, for the buckets of one request (in one slot).
--
-- KEYS[i]: the bucket keys.
-- ARGV: the call's deadline in the server's time (microseconds; 0: none): a call that runs
--   after it (the gateway gave up on it) changes nothing and replies 'late'. Then per bucket,
--   9 values: capacity, rate, extra tokens, error (1/0), threshold,
--   window (µs), factor (0: not adaptive), min_capacity, hold (µs).
--
-- State: decide.lua's one string of little-endian doubles per bucket: tokens and ts, then
-- level, hold and keep, then the times of the key's recent errors.
--
-- An extra charge may take the bucket into debt, down to -capacity; a negative one (a
-- settlement's refund) gives tokens back up to the capacity. An error is added to the
-- key's recent errors (at most `threshold`, none older than `window`); the threshold-th trips
-- the key: level + 1, errors cleared, tokens clamped to the reduced capacity. Any error of a
-- penalised key extends the reduction to now + hold.
--
-- Reply: per bucket '1' if the key tripped, else '0'.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local deadline = tonumber(ARGV[1])
if deadline > 0 and now > deadline then
  return { 'late' }
end

local function multiplier(factor, level, floor)
  if factor <= 0 or level <= 0 then
    return 1
  end
  return math.max(factor ^ level, floor)
end

local reply = {}
for i = 1, #KEYS do
  -- One pass of a loop that runs once: `break` goes on to the next bucket (Lua 5.1 has no
  -- continue).
  repeat
  local base = 1 + (i - 1) * 9
  local capacity = tonumber(ARGV[base + 1])
  local rate = tonumber(ARGV[base + 2])
  local extra = tonumber(ARGV[base + 3])
  local is_error = ARGV[base + 4] == '1'
  local threshold = tonumber(ARGV[base + 5])
  local window = tonumber(ARGV[base + 6])
  local factor = tonumber(ARGV[base + 7])
  local floor = math.min(1, tonumber(ARGV[base + 8]) / capacity)
  local hold_for = tonumber(ARGV[base + 9])

  -- The bucket as decide.lua stores it; a key of another type (an earlier version's hash)
  -- reads as none.
  local stored = redis.pcall('GET', KEYS[i])
  if type(stored) ~= 'string' or #stored < 16 then stored = false end
  if rate == 0 then
    -- A calendar quota: `factor` and `min_capacity` carry the ends of the period the gateway
    -- decided in and of the next (Unix seconds); the server's clock picks which one counts,
    -- as in decide.lua. Another period's count is a full quota.
    local period = tonumber(ARGV[base + 7])
    if now >= period * 1000000 then period = tonumber(ARGV[base + 8]) end
    local tokens = capacity
    if stored then
      local stored_tokens, stored_period = struct.unpack('<dd', stored)
      if stored_period == period then tokens = stored_tokens end
    end
    tokens = math.min(capacity, math.max(-capacity, tokens - extra))
    redis.call('SET', KEYS[i], struct.pack('<dd', tokens, period), 'PX',
      string.format('%d', math.max(math.ceil(period * 1000 - now / 1000), 0) + 1000))
    reply[#reply + 1] = '0'
    break
  end
  local level, hold = 0, 0
  local errors = {}
  if stored and #stored >= 40 then
    level, hold = struct.unpack('<dd', stored, 17)
    for at = 41, #stored - 7, 8 do
      local stamp = struct.unpack('<d', stored, at)
      if stamp >= now - window then
        errors[#errors + 1] = stamp
      end
    end
  end
  if now >= hold then
    level = 0
  end
  local m = multiplier(factor, level, floor)
  local tokens = capacity * m
  -- A bucket's moment only moves forward: behind the stored one, nothing refills.
  local moment = now
  if stored then
    local stored_tokens, ts = struct.unpack('<dd', stored)
    local elapsed = math.max(0, now - ts) / 1000000
    moment = math.max(now, ts)
    tokens = math.min(capacity * m, stored_tokens + elapsed * rate * m)
  end
  -- A refund (a negative extra) never fills the bucket past its capacity.
  tokens = math.min(capacity * m, math.max(-capacity * m, tokens - extra))

  local tripped = false
  if is_error and factor > 0 then
    errors[#errors + 1] = now
    while #errors > threshold do
      table.remove(errors, 1)
    end
    if #errors >= threshold then
      level = level + 1
      errors = {}
      tripped = true
    end
    if level > 0 then
      hold = now + hold_for
    end
    m = multiplier(factor, level, floor)
    tokens = math.min(tokens, capacity * m)
  end

  local keep = 0
  if level > 0 then
    keep = hold
  end
  if #errors > 0 then
    keep = math.max(keep, errors[#errors] + window)
  end
  local packed = { struct.pack('<ddddd', tokens, moment, level, hold, keep) }
  for _, stamp in ipairs(errors) do
    packed[#packed + 1] = struct.pack('<d', stamp)
  end
  local refill_ms = math.ceil(((capacity * m - tokens) / (rate * m) * 1000000 + moment - now) / 1000)
  local keep_ms = math.ceil((keep - now) / 1000)
  redis.call('SET', KEYS[i], table.concat(packed), 'PX',
    string.format('%d', math.min(math.max(refill_ms, keep_ms, 0), 315360000000) + 1000))
  reply[#reply + 1] = tripped and '1' or '0'
  until true
end
return reply
