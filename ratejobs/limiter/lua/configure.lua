--[[
configure.lua: set a limiter's limits. A change takes effect at the next grant: it starts a new
generation, so reservations made under the old limits are made again, and the pace still owed
for past grants is converted to the new rate (a grant at 1 per minute owes a minute at the old
rate but only 10 ms after a change to 100/s).

KEYS[1] config hash
KEYS[2] state hash
ARGV[1..8] rate, period, burst, max_concurrency, adaptive (0/1), min_rate, decrease_factor,
           recovery_seconds
ARGV[9]    version of these limits at their source of truth, 0 when unversioned
ARGV[10]   windows, "rate,period,burst,unit;..." ("" for none); a window that changed keeps
           what it is owed in units (converted as the main rate's is), one that is gone is
           forgotten; windows are matched by position
ARGV[11]   1 when the adaptive rate learns the real limit (prelude's "Learning the real limit"),
           0 for plain CUBIC

A configuration older than the stored one (a lower version) is not written: a worker that read
the limits before an operator changed them must not put the old ones back.

Returns {changed, generation, now_us, outdated}: changed is 1 when any value differed from the
stored one and was written; outdated is 1 when ARGV[9] was older than the stored version.
]]

local fields = {'rate', 'period', 'burst', 'max_concurrency', 'adaptive', 'min_rate',
  'decrease_factor', 'recovery_seconds', 'version', 'windows', 'learn'}
local stored = redis.call('HMGET', KEYS[1], unpack(fields))
if (tonumber(stored[9]) or 0) > tonumber(ARGV[9]) then
  local now = now_us()
  return {0, load_state(KEYS[2], now).generation, now, 1}
end
-- A new version with the same limits is recorded without starting a new generation.
local changed = 0
local pairs_to_set = {}
for i, field in ipairs(fields) do
  if stored[i] ~= ARGV[i] and field ~= 'version' then
    changed = 1
  end
  pairs_to_set[#pairs_to_set + 1] = field
  pairs_to_set[#pairs_to_set + 1] = ARGV[i]
end
local now = now_us()
local st = load_state(KEYS[2], now)
if changed == 0 and stored[9] ~= ARGV[9] then
  redis.call('HSET', KEYS[1], 'version', ARGV[9])
end
if changed == 1 then
  local old = load_config(KEYS[1])
  redis.call('HSET', KEYS[1], unpack(pairs_to_set))
  local new = load_config(KEYS[1])
  if old and st.granted_tat > 0 then
    st.granted_tat = st.granted_tat * interval_us(new, current_rate(new, st, now))
      / interval_us(old, current_rate(old, st, now))
    store_time(KEYS[2], 'granted_tat', now, st.granted_tat)
  end
  if old then
    load_windows(KEYS[2], old, st, now)
    local kept = {}
    for i, win in ipairs(new.windows) do
      local was = old.windows[i]
      local owed = 0
      if was and was.unit == win.unit then
        owed = math.max(st.w[i].granted, 0) * win.interval / was.interval
      end
      kept[i] = {tat = owed, granted = owed}
    end
    for i = #new.windows + 1, #old.windows do
      local p = 'w' .. i .. '_'
      redis.call('HDEL', KEYS[2], p .. 'tat_us', p .. 'tat_frac', p .. 'granted_tat_us',
        p .. 'granted_tat_frac', p .. 'generation')
    end
    st.w = kept
    store_windows(KEYS[2], st, now)
  end
  new_generation(KEYS[2], st, now)
end
renew_bucket({KEYS[1], KEYS[2]}, load_config(KEYS[1]), st, now, 0)
return {changed, st.generation, now, 0}
