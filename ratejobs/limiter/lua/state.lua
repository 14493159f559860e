--[[
state.lua: read a limiter's configuration and live state, for the admin, metrics and tests.
Reads only.

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] leases sorted set

Returns {configured, now_us, rate, period, burst, max_concurrency, adaptive, min_rate,
         current_rate, next_free_us, blocked_until_us, in_flight, generation, counts, version}
  configured is 0 (and the rest zeros) when there is no config hash; rates are strings;
  next_free_us is the earliest slot a one-unit request asking now would get; counts lists the
  running counts in prelude's COUNTERS order (0 where nothing happened yet, and after a reset).
]]

local now = now_us()
local counts = {}
for i, event in ipairs(COUNTERS) do
  counts[i] = 'n_' .. event
end
counts = redis.call('HMGET', KEYS[2], unpack(counts))
for i = 1, #COUNTERS do
  counts[i] = tonumber(counts[i]) or 0
end
local cfg = load_config(KEYS[1])
if not cfg then
  return {0, now, '0', '0', 0, 0, 0, '0', '0', 0, 0, 0, 0, counts, 0}
end
local st = load_state(KEYS[2], now)
local rate = current_rate(cfg, st, now)
local next_free = now + next_slot_offset(cfg, st, now, 1, interval_us(cfg, rate))
return {1, now, as_string(cfg.rate), as_string(cfg.period), cfg.burst, cfg.max_concurrency,
  cfg.adaptive and 1 or 0, as_string(cfg.min_rate), as_string(rate), next_free,
  st.blocked_until, redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf'), st.generation, counts, cfg.version}
