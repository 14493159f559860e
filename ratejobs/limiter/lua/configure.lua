--[[
configure.lua: set a limiter's limits. A change takes effect at the next grant: it starts a new
generation, so reservations made under the old limits are made again, and the pace still owed
for past grants is converted to the new rate (a grant at 1 per minute owes a minute at the old
rate but only 10 ms after a change to 100/s).

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] headroom history of the cost windows (lib/refunds.lua), converted with them
ARGV[1..8] rate, period, burst, max_concurrency, adaptive (0/1), min_rate, decrease_factor,
           recovery_seconds
ARGV[9]    version of these limits at their source of truth, 0 when unversioned
ARGV[10]   windows, "rate,period,burst,unit;..." ("" for none). A window is known by what it
           limits, its period and unit, not by its place in the list (the k-th of several with
           the same period and unit is the k-th of them before). One that stays keeps the units
           it has used, at its new rate and burst; one that is gone is forgotten; a new one
           starts with the units used of the slowest memory that bounds it (new_window_used)
ARGV[11]   1 when the adaptive rate learns the real limit (lib/adaptive.lua),
           0 for plain CUBIC

A configuration older than the stored one (a lower version) is not written: a worker that read
the limits before an operator changed them must not put the old ones back.

Returns {changed, generation, now_us, outdated}: changed is 1 when any value differed from the
stored one and was written; outdated is 1 when ARGV[9] was older than the stored version.
]]

-- Which old window each new one is (its index in old_windows; nil for a new window).
local function match_windows(old_windows, new_windows)
  local free = {}
  for j, was in ipairs(old_windows) do
    local id = as_string(was.period) .. ',' .. was.unit
    free[id] = free[id] or {}
    table.insert(free[id], j)
  end
  local matched = {}
  for i, win in ipairs(new_windows) do
    local same = free[as_string(win.period) .. ',' .. win.unit]
    if same and #same > 0 then
      matched[i] = table.remove(same, 1)
    end
  end
  return matched
end

-- The units a new window starts with used. A memory of the same unit (an old window, or the
-- main rate for requests when it is not adaptive) that drains no faster than the new window
-- has counted every unit the new window would still hold had it been there all along (a
-- bucket's level is its largest excess of units over drain; a slower drain only raises it),
-- so the least of their units used is a bound. Nothing slower remembers the new window's
-- period: the API may well have counted a whole burst in it, so it starts spent and refills
-- at its rate.
local function new_window_used(win, memories)
  local used = win.burst
  for _, m in ipairs(memories) do
    if m.unit == win.unit and m.per_second <= win.rate / win.period then
      used = math.min(used, m.used)
    end
  end
  return used
end

-- The history's entries follow their windows to their new places, their headroom converted
-- to the new interval (units stay units); a dropped window's go. A new cost window never
-- counted the grants before it, so it gets an entry of no headroom after them: a refund of
-- one of them gives it nothing back.
local ZADD_CHUNK = 500
local function convert_history(heads_key, st, now, old, new, matched)
  local members = redis.call('ZRANGE', heads_key, 0, -1, 'WITHSCORES')
  if #members == 0 then
    return
  end
  local to_new = {}
  for i, j in pairs(matched) do
    to_new[j] = i
  end
  local entries = {}
  for k = 1, #members, 2 do
    local j, seq, headroom = string.match(members[k], '^(%d+):(%d+):(%d+)$')
    j = tonumber(j)
    local i = to_new[j]
    if i then
      local scaled = tonumber(headroom) * new.windows[i].interval / old.windows[j].interval
      entries[#entries + 1] = {members[k + 1], i .. ':' .. seq .. ':' .. math.floor(scaled)}
    end
  end
  local marked = false
  for i, win in ipairs(new.windows) do
    if win.cost and not matched[i] then
      if not marked then
        next_cost_seq(st, now)
        marked = true
      end
      entries[#entries + 1] = {st.cost_seq, i .. ':' .. as_string(st.cost_seq) .. ':0'}
    end
  end
  redis.call('DEL', heads_key)
  for first = 1, #entries, ZADD_CHUNK do
    local args = {}
    for k = first, math.min(#entries, first + ZADD_CHUNK - 1) do
      args[#args + 1] = entries[k][1]
      args[#args + 1] = entries[k][2]
    end
    redis.call('ZADD', heads_key, unpack(args))
  end
end

-- ARGV[i] is the value of CONFIG_FIELDS[i] (lib/config.lua).
local stored = read_fields(KEYS[1], CONFIG_FIELDS)
if (tonumber(stored.version) or 0) > tonumber(ARGV[9]) then
  local now = now_us()
  return {0, load_state(KEYS[2], now, true).generation, now, 1}
end
-- A new version with the same limits is recorded without starting a new generation.
local changed = 0
local pairs_to_set = {}
for i, field in ipairs(CONFIG_FIELDS) do
  if stored[field] ~= ARGV[i] and field ~= 'version' then
    changed = 1
  end
  pairs_to_set[#pairs_to_set + 1] = field
  pairs_to_set[#pairs_to_set + 1] = ARGV[i]
end
local now = now_us()
local st = load_state(KEYS[2], now)
if changed == 0 and stored.version ~= ARGV[9] then
  redis.call('HSET', KEYS[1], 'version', ARGV[9])
end
if changed == 1 then
  local old = load_config(KEYS[1])
  redis.call('HSET', KEYS[1], unpack(pairs_to_set))
  local new = load_config(KEYS[1])
  local memories = {}
  if old and not old.adaptive then
    memories[1] = {unit = 'requests', per_second = old.rate / old.period,
      used = math.max(st.granted_tat, 0) / interval_us(old, old.rate)}
  end
  if old and st.granted_tat > 0 then
    st.granted_tat = st.granted_tat * interval_us(new, current_rate(new, st, now))
      / interval_us(old, current_rate(old, st, now))
    store_time(KEYS[2], 'granted_tat', now, st.granted_tat)
  end
  if old then
    load_windows(KEYS[2], old, st, now)
    local used = {}
    for j, was in ipairs(old.windows) do
      used[j] = math.max(st.w[j].granted, 0) / was.interval
      memories[#memories + 1] = {unit = was.unit, per_second = was.rate / was.period,
        used = used[j]}
    end
    local matched = match_windows(old.windows, new.windows)
    local kept = {}
    for i, win in ipairs(new.windows) do
      local owed = (matched[i] and used[matched[i]] or new_window_used(win, memories))
        * win.interval
      kept[i] = {tat = owed, granted = owed}
    end
    for i = #new.windows + 1, #old.windows do
      local p = 'w' .. i .. '_'
      redis.call('HDEL', KEYS[2], p .. 'tat_us', p .. 'tat_frac', p .. 'granted_tat_us',
        p .. 'granted_tat_frac', p .. 'generation')
    end
    convert_history(KEYS[3], st, now, old, new, matched)
    st.w = kept
    store_windows(KEYS[2], st, now)
  end
  new_generation(KEYS[2], st, now)
end
renew_bucket({KEYS[1], KEYS[2]}, load_config(KEYS[1]), st, now, 0, KEYS[3])
return {changed, st.generation, now, 0}
