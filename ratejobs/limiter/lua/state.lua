--[[
state.lua: read a limiter's configuration and live state, for the admin, metrics and tests.
Reads only.

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] leases sorted set

Returns the state by name: a flat list of alternating field names and values (as HGETALL
replies), the fields
  configured      0 (and only now_us and counts follow) when there is no config hash, else 1
  now_us          Redis TIME
  rate, period, burst, max_concurrency, adaptive (0/1), min_rate, config_version
                  the stored limits; rates are strings
  current_rate    the adaptive rate now (a string)
  next_free_us    the earliest slot a one-unit request asking now would get
  blocked_until_us, in_flight, generation
  learned_rate    the real limit the adaptive rate learned (requests per period, a string), ''
                  until it has measured one
  counts          the running counts as name/value pairs, one per lib/state.lua COUNTERS
                  (0 where nothing happened yet, and after a reset)
  windows         per config window, a list of name/value pairs: rate, period, burst, unit,
                  remaining (units left now, a string), next_free_in_us and full_in_us (µs
                  until one more unit and until the whole burst is back; reservations count as
                  taken)
]]

local now = now_us()
local counted = {}
for i, event in ipairs(COUNTERS) do
  counted[i] = 'n_' .. event
end
counted = redis.call('HMGET', KEYS[2], unpack(counted))
local counts = {}
for i, event in ipairs(COUNTERS) do
  counts[#counts + 1] = event
  counts[#counts + 1] = tonumber(counted[i]) or 0
end
local cfg = load_config(KEYS[1])
if not cfg then
  return {'configured', 0, 'now_us', now, 'counts', counts}
end
local st = load_state(KEYS[2], now, true)
load_windows(KEYS[2], cfg, st, now)
local rate = current_rate(cfg, st, now)
local windows = {}
for i, win in ipairs(cfg.windows) do
  local owed = math.max(st.w[i].tat, 0)
  windows[i] = {'rate', as_string(win.rate), 'period', as_string(win.period), 'burst', win.burst,
    'unit', win.unit,
    'remaining', as_string(math.max(0, math.min(win.burst, win.burst - owed / win.interval))),
    'next_free_in_us', math.ceil(math.max(0, owed - (win.burst - 1) * win.interval)),
    'full_in_us', math.ceil(owed)}
end
return {'configured', 1, 'now_us', now, 'rate', as_string(cfg.rate),
  'period', as_string(cfg.period), 'burst', cfg.burst, 'max_concurrency', cfg.max_concurrency,
  'adaptive', cfg.adaptive and 1 or 0, 'min_rate', as_string(cfg.min_rate),
  'config_version', cfg.version, 'current_rate', as_string(rate),
  'next_free_us', now + next_slot_offset(cfg, st, now, 1, interval_us(cfg, rate)),
  'blocked_until_us', st.blocked_until,
  'in_flight', redis.call('ZCOUNT', KEYS[3], '(' .. as_string(now), '+inf'), 'generation', st.generation,
  'learned_rate', st.learned and as_string(st.learned) or '', 'counts', counts,
  'windows', windows}
