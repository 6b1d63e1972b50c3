-- verdict: rate-limit decisions, token bucket + sliding window, atomically.
-- The same arithmetic as limiter/src/algo.rs (`decide`); every intermediate stays below
-- 2^53 so Lua's doubles compute exactly what Rust's integers do.
--
-- One call decides one or more requests: the store sends together the requests that
-- arrive while its previous call is on the wire. They are decided in order, each seeing
-- the writes of those before it, at one instant. In Redis Cluster, every key of one call
-- is in one slot.
--
-- KEYS[i]  request i's hash, "rl:{g<group>}" or "rl:{<key id hex>#<sub key>}" (see
--          layout.rs)
-- ARGV[1]  the time to use instead of the server's TIME, ms, or '' (tests only)
-- ARGV[2]  TTL of a hash, in windows (two)
-- ARGV[3]  C, how many of the keys are charges (they come first)
-- then six per charge j (KEYS[j], j <= C), from ARGV[4 + 6 * (j - 1)]:
--          field, capacity, refill, quota, window (as for a request), and the count of
--          requests admitted elsewhere (the local fallback) to count here
-- then six per request i (KEYS[C + i]), from ARGV[4 + 6 * C + 6 * (i - 1)]:
--          field: key id (16 bytes), route class, tier (one limit key's state in the hash),
--          capacity (tokens), refill (units per ms; 1 token = 1e6 units),
--          quota per window, window (ms), hits (what the request counts as; 0 checks
--          without counting)
--
-- Returns six integers per request (none per charge): {allowed (0/1), denied bits (1
-- bucket, 2 window), remaining tokens, remaining window, retry-after ms, now ms}.
-- A charge takes its count from the bucket (into debt, down to minus the capacity) and
-- adds it to the window's count, always writing: the same arithmetic as algo.rs (`charge`).
-- State: struct "<ddII": tokens (units), last allowed ms, count in last's window, count in
-- the window before. A denial writes nothing; the TTL is refreshed once per window.
-- The empty field of a hash holds the window in which the script last swept it: removed
-- the fields of keys idle for the TTL, which the hash's own TTL does not do while other
-- keys of its group are active.

local UNITS = 1000000
local ttl_windows = tonumber(ARGV[2])

local clock
if ARGV[1] ~= '' then
  clock = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local out = {}
local n = 0

-- Appends the six integers of one answer to `out`.
local function answer(allowed, bits, tokens, window, retry, now)
  out[n + 1] = allowed
  out[n + 2] = bits
  out[n + 3] = tokens
  out[n + 4] = window
  out[n + 5] = retry
  out[n + 6] = now
  n = n + 6
end

-- Removes the fields of `hash` last written at or before `horizon` (ms): what the TTL
-- would have removed of a hash of their own.
local function sweep(hash, horizon)
  local all = redis.call('HGETALL', hash)
  for j = 1, #all, 2 do
    local f, v = all[j], all[j + 1]
    if f ~= '' and #v == 24 then
      local _, last = struct.unpack('<dd', v)
      if last <= horizon then
        redis.call('HDEL', hash, f)
      end
    end
  end
end

-- A limit key's state at the call's instant: {packed (false for a key never seen), now,
-- tokens refilled to now, window index of the last write and of now, previous and current
-- window's counts rolled to now, offset into the current window}.
local function load(hash, field, cap, rate, w)
  local now = clock
  local tokens, last, cur, prev = cap, now, 0, 0
  local packed = redis.call('HGET', hash, field)
  if packed then
    tokens, last, cur, prev = struct.unpack('<ddII', packed)
  end
  if now < last then now = last end

  -- Refill, arithmetic on read.
  local deficit = cap - tokens
  if deficit <= 0 then
    tokens = cap
  elseif rate > 0 then
    local elapsed = now - last
    if elapsed > math.floor(deficit / rate) then
      tokens = cap
    else
      tokens = tokens + elapsed * rate
    end
  end

  -- Roll the window.
  local i_last = math.floor(last / w)
  local i_now = math.floor(now / w)
  local p, c
  if i_now == i_last then
    p, c = prev, cur
  elseif i_now == i_last + 1 then
    p, c = cur, 0
  else
    p, c = 0, 0
  end
  return packed, now, tokens, i_last, i_now, p, c, now - i_now * w
end

-- Writes a key's new state.
local function store(hash, field, packed, now, tokens, i_last, i_now, p, c, w)
  redis.call('HSET', hash, field, struct.pack('<ddII', tokens, now, c, p))
  -- The TTL (two windows) is set at the first write of each window: a hash written in
  -- every window never expires, and one idle for a whole window expires when every
  -- state in it is stale. Refreshing it on every request would cost a third of the
  -- script. The hash is swept once a window, at the first such write.
  if not packed or i_now ~= i_last then
    redis.call('PEXPIRE', hash, w * ttl_windows)
    local swept = tostring(i_now)
    if redis.call('HGET', hash, '') ~= swept then
      sweep(hash, now - w * ttl_windows)
      redis.call('HSET', hash, '', swept)
    end
  end
end

-- Counts `count` requests admitted elsewhere.
local function charge(hash, field, cap, rate, w, count)
  local packed, now, tokens, i_last, i_now, p, c = load(hash, field, cap, rate, w)
  tokens = math.max(tokens - count * UNITS, -cap)
  c = math.min(c + count, 1000000000)
  store(hash, field, packed, now, tokens, i_last, i_now, p, c, w)
end

-- Decides one request of `h` hits.
local function decide(hash, field, cap, rate, q, w, h)
  local packed, now, tokens, i_last, i_now, p, c, e = load(hash, field, cap, rate, w)
  local used = p * (w - e) + c * w
  local cost = h * UNITS

  local bucket_ok = tokens >= cost
  local window_ok = used + h * w <= q * w

  if bucket_ok and window_ok then
    tokens = tokens - cost
    c = c + h
    if h > 0 then
      store(hash, field, packed, now, tokens, i_last, i_now, p, c, w)
    end
    answer(1, 0, math.floor(tokens / UNITS), math.floor(math.max(q * w - used - h * w, 0) / w), 0, now)
    return
  end

  local bucket_wait = 0
  if not bucket_ok then
    if rate == 0 or cost > cap then
      bucket_wait = w
    else
      bucket_wait = math.floor((cost - tokens + rate - 1) / rate)
    end
  end

  local window_wait = 0
  if not window_ok then
    if q == 0 or h > q then
      window_wait = w
    else
      local found = false
      if c + h <= q and p > 0 then
        local span = math.floor(math.min((q - c - h) * w, p * w) / p)
        local at = w - span
        if at < w then
          window_wait = at - e
          found = true
        end
      end
      if not found then
        local at_next = 0
        if c > 0 then
          at_next = w - math.floor(math.min((q - h) * w, c * w) / c)
        end
        window_wait = (w - e) + at_next
      end
    end
  end

  local bits = 0
  if not bucket_ok then bits = bits + 1 end
  if not window_ok then bits = bits + 2 end
  local retry = math.max(bucket_wait, window_wait)
  if retry > 4294967295 then retry = 4294967295 end
  answer(0, bits, math.floor(math.max(tokens, 0) / UNITS), math.floor(math.max(q * w - used, 0) / w), retry, now)
end

local charges = tonumber(ARGV[3])
for j = 1, charges do
  local a = 4 + 6 * (j - 1)
  charge(KEYS[j], ARGV[a], tonumber(ARGV[a + 1]) * UNITS, tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]))
end
for i = 1, #KEYS - charges do
  local a = 4 + 6 * charges + 6 * (i - 1)
  decide(KEYS[charges + i], ARGV[a], tonumber(ARGV[a + 1]) * UNITS, tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]))
end
return out
