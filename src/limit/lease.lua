-- A replica's token lease of one bucket: gives back what its last lease did not spend, then
-- hands over up to `want` tokens, if the bucket holds at least `need` (else none).
--
-- KEYS[1]: the bucket. ARGV: capacity, rate (tokens per second), want, need, give_back.
-- State as decide.lua's: one string of little-endian doubles, tokens and ts (the server's
-- time in microseconds).
-- Reply: { granted, tokens left in the bucket }, as text (exact doubles).

local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, need, give_back = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local stored = redis.pcall('GET', KEYS[1])
local current = capacity
-- A bucket's moment only moves forward: behind the stored one, nothing refills.
local moment = now
if type(stored) == 'string' and #stored >= 16 then
  local tokens, ts = struct.unpack('<dd', stored)
  local elapsed = now - ts
  if elapsed < 0 then elapsed, moment = 0, ts end
  current = tokens + elapsed / 1000000 * rate
end
current = current + give_back
if current > capacity then current = capacity end
local granted = 0
if current >= need then
  granted = want
  if granted > current then granted = current end
end
local tokens = current - granted
if granted > 0 or give_back > 0 then
  local expire_ms = math.ceil(((capacity - tokens) / rate * 1000000 + moment - now) / 1000)
  if expire_ms > 315360000000 then expire_ms = 315360000000 end
  redis.call('SET', KEYS[1], struct.pack('<dd', tokens, moment), 'PX',
    string.format('%d', expire_ms + 1000))
end
return { string.format('%.17g', granted), string.format('%.17g', tokens) }
