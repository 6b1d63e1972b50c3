-- verdict: one rate-limit decision, token bucket + sliding window, atomically.
-- The same arithmetic as limiter/src/algo.rs (`decide`); every intermediate stays below
-- 2^53 so Lua's doubles compute exactly what Rust's integers do.
--
-- KEYS[1]  the key's hash, "rl:{<key id hex>}" or "rl:{<key id hex>#<sub key>}"
-- ARGV[1]  field: "<route class>.<tier>" (one limit key's state inside the hash)
-- ARGV[2]  capacity, tokens
-- ARGV[3]  refill, units per ms (1 token = 1e6 units)
-- ARGV[4]  quota per window
-- ARGV[5]  window, ms
-- ARGV[6]  TTL of the hash, ms (two windows)
-- ARGV[7]  optional: the time to use instead of the server's TIME (tests only)
--
-- Returns {allowed (0/1), denied bits (1 bucket, 2 window), remaining tokens,
--          remaining window, retry-after ms, now ms}.
-- State: struct "<ddII": tokens (units), last allowed ms, count in last's window, count in
-- the window before. A denial writes nothing; the TTL is refreshed once per window.

local UNITS = 1000000
local field = ARGV[1]
local cap = tonumber(ARGV[2]) * UNITS
local rate = tonumber(ARGV[3])
local q = tonumber(ARGV[4])
local w = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])

local now
if ARGV[7] and ARGV[7] ~= '' then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local tokens, last, cur, prev = cap, now, 0, 0
local packed = redis.call('HGET', KEYS[1], field)
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
local e = now - i_now * w
local used = p * (w - e) + c * w

local bucket_ok = tokens >= UNITS
local window_ok = used + w <= q * w

if bucket_ok and window_ok then
  tokens = tokens - UNITS
  c = c + 1
  redis.call('HSET', KEYS[1], field, struct.pack('<ddII', tokens, now, c, p))
  -- The TTL (two windows) is set at the first write of each window: a hash written in
  -- every window never expires, and one idle for a whole window expires when every state
  -- in it is stale. Refreshing it on every request would cost a third of the script.
  if not packed or i_now ~= i_last then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {1, 0, math.floor(tokens / UNITS), math.floor(math.max(q * w - used - w, 0) / w), 0, now}
end

local bucket_wait = 0
if not bucket_ok then
  if rate == 0 then
    bucket_wait = w
  else
    bucket_wait = math.floor((UNITS - tokens + rate - 1) / rate)
  end
end

local window_wait = 0
if not window_ok then
  if q == 0 then
    window_wait = w
  else
    local found = false
    if c < q and p > 0 then
      local span = math.floor(math.min((q - c - 1) * w, p * w) / p)
      local at = w - span
      if at < w then
        window_wait = at - e
        found = true
      end
    end
    if not found then
      local at_next = 0
      if c > 0 then
        at_next = w - math.floor(math.min((q - 1) * w, c * w) / c)
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
return {0, bits, math.floor(tokens / UNITS), math.floor(math.max(q * w - used, 0) / w), retry, now}
