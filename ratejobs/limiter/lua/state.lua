--[[
state.lua: read a limiter's configuration and live state, for the admin, metrics and tests.
Reads only.

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] leases sorted set

Returns {configured, now_us, rate, period, burst, max_concurrency, adaptive, min_rate,
         current_rate, next_free_us, blocked_until_us, in_flight, generation, counts, version,
         learned_rate, windows}
  configured is 0 (and the rest zeros) when there is no config hash; rates are strings;
  next_free_us is the earliest slot a one-unit request asking now would get; counts lists the
  running counts in prelude's COUNTERS order (0 where nothing happened yet, and after a reset);
  learned_rate is the real limit the adaptive rate learned (requests per period, a string), ''
  until it has measured one;
  windows lists, per config window, {rate, period, burst, unit, remaining, next_free_in_us,
  full_in_us}: units left now (a string), µs until one more unit and until the whole burst is
  back (reservations count as taken).
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
  return {0, now, '0', '0', 0, 0, 0, '0', '0', 0, 0, 0, 0, counts, 0, '', {}}
end
local st = load_state(KEYS[2], now, true)
load_windows(KEYS[2], cfg, st, now)
local rate = current_rate(cfg, st, now)
local next_free = now + next_slot_offset(cfg, st, now, 1, interval_us(cfg, rate))
local windows = {}
for i, win in ipairs(cfg.windows) do
  local owed = math.max(st.w[i].tat, 0)
  windows[i] = {as_string(win.rate), as_string(win.period), win.burst, win.unit,
    as_string(math.max(0, math.min(win.burst, win.burst - owed / win.interval))),
    math.ceil(math.max(0, owed - (win.burst - 1) * win.interval)), math.ceil(owed)}
end
return {1, now, as_string(cfg.rate), as_string(cfg.period), cfg.burst, cfg.max_concurrency,
  cfg.adaptive and 1 or 0, as_string(cfg.min_rate), as_string(rate), next_free,
  st.blocked_until, redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf'), st.generation, counts, cfg.version,
  st.learned and as_string(st.learned) or '', windows}
