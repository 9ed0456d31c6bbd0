-- After the upstream answered: extra charges by status (charge_on_status) and errors for
-- adaptive penalties, for the buckets of one request (in one slot).
--
-- KEYS[i]: the bucket keys.
-- ARGV: the call's deadline in the server's time (microseconds; 0: none): a call that runs
--   after it (the gateway gave up on it) changes nothing and replies 'late'. Then per bucket,
--   9 values: capacity, rate, extra tokens, error (1/0), threshold,
--   window (µs), factor (0: not adaptive), min_capacity, hold (µs).
--
-- An extra charge may take the bucket into debt, down to -capacity. An error is added to the
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

  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts', 'level', 'hold', 'errors')
  local level = tonumber(state[3]) or 0
  local hold = tonumber(state[4]) or 0
  if now >= hold then
    level = 0
  end
  local m = multiplier(factor, level, floor)
  local tokens = capacity * m
  if state[1] and state[2] then
    local elapsed = math.max(0, now - tonumber(state[2])) / 1000000
    tokens = math.min(capacity * m, tonumber(state[1]) + elapsed * rate * m)
  end
  tokens = math.max(-capacity * m, tokens - extra)

  local errors = {}
  if state[5] then
    for stamp in string.gmatch(state[5], '%d+') do
      if tonumber(stamp) >= now - window then
        errors[#errors + 1] = stamp
      end
    end
  end
  local tripped = false
  if is_error and factor > 0 then
    errors[#errors + 1] = string.format('%d', now)
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
    keep = math.max(keep, tonumber(errors[#errors]) + window)
  end
  redis.call('HSET', KEYS[i],
    'tokens', string.format('%.17g', tokens), 'ts', string.format('%d', now),
    'level', string.format('%d', level), 'hold', string.format('%d', hold),
    'errors', table.concat(errors, ','), 'keep', string.format('%d', keep))
  local refill_ms = math.ceil((capacity * m - tokens) / (rate * m) * 1000)
  local keep_ms = math.ceil((keep - now) / 1000)
  redis.call('PEXPIRE', KEYS[i], string.format('%d', math.min(math.max(refill_ms, keep_ms, 0), 315360000000) + 1000))
  reply[#reply + 1] = tripped and '1' or '0'
end
return reply
