--[[
lib/leases.lua: the in-flight cap: leases, and wake-ups for callers waiting for one.
]]

-- Drop expired leases; how many more fit under max_concurrency (math.huge without a cap).
local function free_leases(cfg, leases_key, now)
  redis.call('ZREMRANGEBYSCORE', leases_key, '-inf', now)
  if cfg.max_concurrency <= 0 then
    return math.huge
  end
  return cfg.max_concurrency - redis.call('ZCARD', leases_key)
end

-- µs until the first live lease expires (what a caller turned away at capacity waits at most).
local function first_expiry_in(leases_key, now)
  local first = redis.call('ZRANGE', leases_key, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) - now
end

-- A wake-up token matters only to callers waiting now, each of whom asks again within a
-- second (core.MAX_CAPACITY_WAIT_SECONDS); one left over wakes a later waiter once for nothing.
local RELEASED_KEPT_MS = 60000

-- Give back `n` freed leases' worth of wake-ups to callers waiting for capacity; the list never
-- holds more tokens than there can be waiters worth waking (max_concurrency).
local function wake_waiters(cfg, released_key, n)
  if n <= 0 or cfg.max_concurrency <= 0 then
    return
  end
  local tokens = {}
  for i = 1, math.min(n, cfg.max_concurrency) do
    tokens[i] = '1'
  end
  redis.call('LPUSH', released_key, unpack(tokens))
  redis.call('LTRIM', released_key, 0, cfg.max_concurrency - 1)
  redis.call('PEXPIRE', released_key, RELEASED_KEPT_MS)
end
