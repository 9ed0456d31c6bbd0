-- A batch of requests (all in one slot), each decided against all of its buckets in one
-- indivisible step, one request after another, as if each were its own call at the same time.
--
-- KEYS: the keys of the batch's buckets and concurrency slots, each once.
-- ARGV[1]: one binary string, little-endian: the deadline of the call in the server's time (a
--   double, microseconds; 0: none): a call that runs after it was given up on by the gateway
--   (Redis was paused, busy or failing over) charges nothing and says so. Then the number of
--   shapes (u32), then each shape: its number of buckets n (u32), then per bucket 6 doubles:
--   capacity, rate (tokens per second), cost, enforce (1; 0: shadow; 2: concurrency slots; a
--   negative number: enforce, but book tokens the bucket lacks down to that many,
--   `on_limit = "delay"`), factor and min_capacity of the limit's adaptive penalty (factor 0:
--   not adaptive). A calendar quota has rate 0, and in place of factor and min_capacity the
--   end of the period the gateway's clock is in and the end of the next one (Unix seconds).
--   Concurrency slots have capacity the number of slots, rate the lease in milliseconds. After
--   each bucket's doubles, its ban rule: `after` (u32; 0: none), and when there is one, within
--   and duration (doubles, microseconds). Then per request: the index of its shape and how
--   many identical requests in a row it stands for (u16 each; a run of more than one only for
--   a shape without slots, bans or booking), then for each of the shape's buckets the index of
--   its key in KEYS (u32), followed for a bucket with a ban rule by the index of its ban key,
--   then, if the shape has slots, the length (u32) and bytes of the request's lease name.
--   Requests of one route share a shape: its numbers are sent, and read, once per batch.
-- State per bucket: one string of little-endian doubles (key_admin.rs reads it for a person):
-- tokens and ts, the Redis server's time in microseconds, then for keys of adaptive limits
-- level, hold and keep and the times of recent errors, written by outcome.lua. A quota's is
-- tokens and p, the end of the period its count belongs to (the server's clock picks which of
-- the two periods the gateway names); another period's count is a full quota, and the key
-- expires when its period ends. A key's concurrency slots are a sorted set of leases scored by
-- when they expire (ms); expired ones are dropped as the set is read. A key's ban state is a
-- key of its own in the same slot (keys.rs names it): refusals, when their window opened and
-- when the ban ends (little-endian doubles, microseconds; 0: no ban).
-- The time is the server's (TIME), so replicas with skewed clocks agree.
--
-- A penalised key's capacity and rate are multiplied by factor^level (never below
-- min_capacity) until `hold`. A request is admitted only if every enforcing bucket holds its
-- cost, or a delaying bucket can book it within its debt, and every concurrency limit has a
-- slot free, and no enforcing bucket's key is banned; then every bucket that can pay or book
-- is charged, and a lease taken of each concurrency limit. A bucket with a ban rule counts its
-- refusals (an enforcing bucket's when the request is refused; a shadow one's whenever it
-- would refuse) in a window opened by the first; the `after`-th within it bans the key for
-- `duration`. Refusals during a ban count nothing. A bucket is written only when charged (refill is lazy: an unwritten
-- bucket keeps meaning the same thing), once per batch however many requests charged it, and
-- expires once it would be full again and its adaptive state no longer matters.
--
-- Reply: one binary string: the server's time (a little-endian double, microseconds) and a
-- byte, 1 when the call came after its deadline (then nothing else follows); then per
-- request: a byte, admitted (1/0), then per bucket: the tokens after (for slots: the slots
-- free after; a little-endian double) and a byte: 1 sufficient, 0 not, plus 4 if the request
-- booked the tokens it lacked (it waits for them), plus 16 if this refusal began a ban, plus 2
-- if the key is under an adaptive penalty, in which case the multiplier follows (a double),
-- plus 8 if the key is banned (the request was refused for it), in which case the seconds of
-- ban left follow (a double); the requests one after another. A run of identical requests
-- is replied as how many of them were admitted (a byte: the first ones, since a refusal leaves
-- the next one the same buckets), then per bucket its tokens before the first (a double) and a
-- byte, 2 when the multiplier follows (a double), else 0: the gateway replays the run's
-- arithmetic, which is cheaper for it than for this script to reply per request.
--
-- This runs inside Redis for every batch, so it is written for Redis's CPU: library functions
-- held in locals, comparisons instead of math.min/max calls, flat tables, and strings from
-- Redis used in arithmetic as they are (Lua converts them, as tonumber would), and tables
-- created at the size the usual request needs (up to four buckets, one request): grown entry by
-- entry, a table is rebuilt several times. Each of these showed in instruction counts of
-- redis-server.

local call, pcall, ceil = redis.call, redis.pcall, math.ceil
-- Numbers go back as the bytes of IEEE doubles (struct.pack '<d'): exact, and cheap, where
-- spelling them with string.format('%.17g') cost a fifth of a batched decision.
local pack, unpack, sub = struct.pack, struct.unpack, string.sub
local clock = call('TIME')
local now = clock[1] * 1000000 + clock[2]
-- The arguments are one binary string, read with struct.unpack: converting numbers from text
-- (strtod) cost more than the Redis commands of a bucket.
local arguments = ARGV[1]
local deadline, shape_count, pos = unpack('<dI4', arguments)
if deadline > 0 and now > deadline then
  return pack('<dB', now, 1)
end

-- Per shape: { n, then per bucket from (i - 1) * 6 + 1: capacity, rate, cost, enforce (a
-- boolean, 'lease' for concurrency slots, or for a delaying bucket the lowest tokens it may
-- book down to), factor (false: not adaptive) and min_capacity; for a quota, factor false and
-- the end of the period its count belongs to }, and `leases` if it has slots.
local shapes = {}
for s = 1, shape_count do
  local count
  count, pos = unpack('<I4', arguments, pos)
  local shape = { count, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
  for i = 1, count do
    local to = (i - 1) * 6 + 1
    local capacity, rate, cost, enforce, factor, min_capacity, after
    capacity, rate, cost, enforce, factor, min_capacity, after, pos =
      unpack('<ddddddI4', arguments, pos)
    if after > 0 then
      -- Ban rules are few: kept beside the shape's flat numbers, by bucket.
      local within, duration
      within, duration, pos = unpack('<dd', arguments, pos)
      shape.bans = shape.bans or {}
      shape.bans[i] = { after, within, duration }
    end
    if enforce == 2 then
      enforce, shape.leases = 'lease', true
    elseif enforce >= 0 then
      enforce = enforce == 1
    end
    -- Slots, bans and booking are decided request by request, never as a run.
    if after > 0 or type(enforce) ~= 'boolean' then shape.single = true end
    shape[to + 1], shape[to + 2], shape[to + 3], shape[to + 4] = capacity, rate, cost, enforce
    if rate == 0 then
      -- A quota counts in the period the server's clock is in, of the two the gateway named.
      if now >= factor * 1000000 then factor = min_capacity end
      shape[to + 5], shape[to + 6] = false, factor
    else
      shape[to + 5], shape[to + 6] = factor ~= 0 and factor, min_capacity
    end
  end
  shapes[s] = shape
end

-- Leases of concurrency slots are scored by when they expire, in milliseconds.
local now_ms = (now - now % 1000) / 1000

-- Per key of KEYS (by index) once read: { tokens now (false: none stored), level, hold,
-- keep, the stored adaptive state as bytes ('' if none), then once charged the capacity and
-- the tokens to store, for a quota the end of its period, once charged the rate, and a
-- bucket's stored moment (µs; false: none) }. The
-- key's expiry is worked out once, as the key is written, from its last charge's numbers:
-- worked out at every charge, its two `ceil` calls cost a twentieth of a batched decision.
local seen = { false, false, false, false }
-- Per bucket of the current request, from (i - 1) * 8: its entry in `seen`, tokens now,
-- capacity, rate, multiplier, cost, sufficient, booked. (Each table a call creates costs Redis
-- about as much as a Redis command's lookup: they are few, and flat.)
local state = { 0, 0, 0, 0, 0, 0, false, false, 0, 0, 0, 0, 0, 0, false, false,
  0, 0, 0, 0, 0, 0, false, false, 0, 0, 0, 0, 0, 0, false, false }
-- Per bucket of the current request with a ban rule: its ban state, as kept in `seen`: {
-- refusals, 'ban', when their window opened, when the ban ends, and once changed the rule }.
-- Made for the first shape with a ban rule: a call without one makes nothing of bans.
local bans
local reply, replied = { pack('<dB', now, 0), '', '', '', '' }, 1
local size = #arguments

while pos <= size do
  local shape_index, run
  shape_index, run, pos = unpack('<HH', arguments, pos)
  local shape = shapes[shape_index]
  if run > 1 and shape.single then
    return redis.error_reply('tollgate: a run of requests whose buckets take slots, ban or book')
  end
  local count = shape[1]
  local admitted = true
  local banned = false
  local rules = shape.bans
  for i = 1, count do
    local at = (i - 1) * 6 + 1
    local index
    index, pos = unpack('<I4', arguments, pos)
    if rules then
      local ban = false
      if rules[i] then
        local ban_index
        ban_index, pos = unpack('<I4', arguments, pos)
        ban = seen[ban_index]
        if not ban then
          local stored = pcall('GET', KEYS[ban_index])
          ban = { 0, 'ban', 0, 0, false }
          if type(stored) == 'string' and #stored == 24 then
            ban[1], ban[3], ban[4] = unpack('<ddd', stored)
          end
          seen[ban_index] = ban
        end
        -- A shadow bucket's ban is counted, never enforced.
        if ban[4] > now and shape[at + 4] ~= false then banned = true end
      end
      bans = bans or {}
      bans[i] = ban
    end
    if shape[at + 4] == 'lease' then
      -- A key's slots: a sorted set of leases; its entry { in use, 'lease', index }.
      local entry = seen[index]
      if not entry then
        call('ZREMRANGEBYSCORE', KEYS[index], '-inf', now_ms)
        entry = { call('ZCARD', KEYS[index]), 'lease', index }
        seen[index] = entry
      end
      local free = shape[at + 1] - entry[1]
      local base = (i - 1) * 8
      state[base + 1], state[base + 2], state[base + 4] = entry, free, shape[at + 2]
      state[base + 7], state[base + 8] = free >= 1, false
      if free < 1 then admitted = false end
    else
      local capacity, rate, factor = shape[at + 1], shape[at + 2], shape[at + 5]
      local entry = seen[index]
      local elapsed = 0
      if not entry then
        -- A key of another type (a hash of an earlier version's format) reads as none.
        local stored = pcall('GET', KEYS[index])
        entry = { false, 0, 0, 0, '', false, false, false, 0, false }
        if type(stored) == 'string' and #stored >= 16 then
          local tokens, second = unpack('<dd', stored)
          if rate == 0 then
            -- A quota's count belongs to the period that ends at `second`.
            if second == shape[at + 6] then entry[1] = tokens end
          else
            entry[1] = tokens
            -- A moment only moves forward: a clock behind the stored one refills nothing
            -- and writes the stored moment back.
            entry[10] = second
            elapsed = now - second
            if elapsed < 0 then elapsed = 0 end
            if #stored > 16 then
              entry[5] = sub(stored, 17)
              entry[2], entry[3], entry[4] = unpack('<ddd', stored, 17)
            end
          end
        end
        if rate == 0 then entry[8] = shape[at + 6] end
        seen[index] = entry
      end
      local multiplier = 1
      if factor and entry[2] > 0 and now < entry[3] then
        local floor = shape[at + 6] / capacity
        if floor > 1 then floor = 1 end
        multiplier = factor ^ entry[2]
        if multiplier < floor then multiplier = floor end
        capacity = capacity * multiplier
        rate = rate * multiplier
      end
      local current = capacity
      if entry[1] then
        current = entry[1] + elapsed / 1000000 * rate
        if current > capacity then current = capacity end
      end
      local cost = shape[at + 3]
      local base = (i - 1) * 8
      state[base + 1], state[base + 2], state[base + 3] = entry, current, capacity
      state[base + 4], state[base + 5], state[base + 6] = rate, multiplier, cost
      local enforce = shape[at + 4]
      local sufficient = current >= cost
      state[base + 7], state[base + 8] = sufficient, false
      if not sufficient and enforce then
        if enforce ~= true and current - cost >= enforce then
          state[base + 8] = true
        else
          admitted = false
        end
      end
    end
  end

  if banned then admitted = false end

  local lease_name
  if shape.leases then
    local length
    length, pos = unpack('<I4', arguments, pos)
    lease_name = sub(arguments, pos, pos + length - 1)
    pos = pos + length
  end

  if run > 1 then
    -- Identical requests in a row: each bucket is charged as the requests one after another
    -- would charge it (the same subtractions), until one is refused, and with it the rest.
    replied = replied + 1
    local counted = replied
    for i = 1, count do
      local base = (i - 1) * 8
      local multiplier = state[base + 5]
      replied = replied + 1
      if multiplier == 1 then
        reply[replied] = pack('<dB', state[base + 2], 0)
      else
        reply[replied] = pack('<dBd', state[base + 2], 2, multiplier)
      end
    end
    local taken = 0
    while admitted and taken < run do
      taken = taken + 1
      for i = 1, count do
        local base = (i - 1) * 8
        local tokens = state[base + 2]
        if tokens >= state[base + 6] then
          tokens = tokens - state[base + 6]
          state[base + 2] = tokens
          local entry = state[base + 1]
          entry[6], entry[7], entry[9] = state[base + 3], tokens, state[base + 4]
        end
      end
      for i = 1, count do
        local base = (i - 1) * 8
        if state[base + 2] < state[base + 6] and shape[(i - 1) * 6 + 5] then admitted = false end
      end
    end
    for i = 1, count do
      local base = (i - 1) * 8
      state[base + 1][1] = state[base + 2]
    end
    reply[counted] = pack('B', taken)
  else
    replied = replied + 1
    reply[replied] = admitted and '\1' or '\0'
    for i = 1, count do
      local base = (i - 1) * 8
      local entry, tokens = state[base + 1], state[base + 2]
      local sufficient, booked = state[base + 7], state[base + 8]
      if entry[2] == 'lease' then
        if admitted then
          local key, lease = KEYS[entry[3]], state[base + 4]
          call('ZADD', key, now_ms + lease, lease_name)
          call('PEXPIRE', key, lease + 1000)
          entry[1], tokens = entry[1] + 1, tokens - 1
        end
        replied = replied + 1
        reply[replied] = pack('<dB', tokens, sufficient and 1 or 0)
      elseif admitted and (sufficient or booked) then
        tokens = tokens - state[base + 6]
        entry[6], entry[7], entry[9] = state[base + 3], tokens, state[base + 4]
      end
      if entry[2] ~= 'lease' then
        -- What the next request of the batch finds in this bucket: no time passes in between.
        entry[1] = tokens
        local multiplier = state[base + 5]
        replied = replied + 1
        local flags = sufficient and 1 or (admitted and booked and 4 or 0)
        local left = false
        if rules and bans[i] then
          local ban, enforce = bans[i], shape[(i - 1) * 6 + 5]
          if banned then
            if ban[4] > now and enforce ~= false then left = (ban[4] - now) / 1000000 end
          elseif flags == 0 and (not admitted or enforce == false) and ban[4] <= now then
            -- A refusal by this bucket: counted in its window, the `after`-th bans the key.
            local rule = rules[i]
            if ban[1] == 0 or now >= ban[3] + rule[2] then
              ban[1], ban[3] = 0, now
            end
            ban[1] = ban[1] + 1
            if ban[1] >= rule[1] then
              ban[1], ban[4] = 0, now + rule[3]
              flags = flags + 16
            end
            ban[5] = rule
          end
        end
        if multiplier == 1 then
          if left then
            reply[replied] = pack('<dBd', tokens, flags + 8, left)
          else
            reply[replied] = pack('<dB', tokens, flags)
          end
        elseif left then
          reply[replied] = pack('<dBdd', tokens, flags + 10, multiplier, left)
        else
          reply[replied] = pack('<dBd', tokens, flags + 2, multiplier)
        end
      end
    end
  end
end

for index = 1, #KEYS do
  local entry = seen[index]
  if entry and entry[6] then
    local expire_ms
    local moment = now
    if entry[10] and entry[10] > now then moment = entry[10] end
    if entry[8] then
      expire_ms = ceil(entry[8] * 1000 - now / 1000)
    else
      expire_ms = ceil(((entry[6] - entry[7]) / entry[9] * 1000000 + moment - now) / 1000)
      local keep_ms = ceil((entry[4] - now) / 1000)
      if keep_ms > expire_ms then expire_ms = keep_ms end
    end
    if expire_ms > 315360000000 then expire_ms = 315360000000 end
    local bytes = pack('<dd', entry[7], entry[8] or moment)
    if entry[5] ~= '' then bytes = bytes .. entry[5] end
    call('SET', KEYS[index], bytes, 'PX', expire_ms + 1000)
  elseif bans and entry and entry[2] == 'ban' and entry[5] then
    -- A ban state that counted a refusal: kept while its window or its ban lasts.
    local rule = entry[5]
    local keep = entry[3] + rule[2]
    if entry[4] > keep then keep = entry[4] end
    call('SET', KEYS[index], pack('<ddd', entry[1], entry[3], entry[4]), 'PX',
      ceil((keep - now) / 1000) + 1000)
  end
end
return table.concat(reply, '', 1, replied)
