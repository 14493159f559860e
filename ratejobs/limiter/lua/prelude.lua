--[[
prelude.lua: helpers shared by every limiter script. scripts.py prepends it to each script body,
so this file has no KEYS, ARGV or return value of its own.

Units: every time is a count of microseconds on the Redis server's clock (TIME), never a
worker's clock, because worker clocks drift apart between machines. Rates are requests per
config.period seconds. Lua numbers are doubles: a microsecond epoch (~1.8e15) is exact as a whole
number but has a resolution of only 0.25 us, so adding a fractional interval (1e6/150 us) to it
at every grant would drift the pace by parts per million. Schedule times are therefore stored as
whole microseconds plus a fraction (<name>_us, <name>_frac) and computed as offsets from now.

State hash fields:
  tat_us/_frac          theoretical arrival time (GCRA) covering every reservation of this
                        generation
  granted_tat_us/_frac  the same, covering only grants; a new generation restarts tat from it
  blocked_until  nothing is sent before this time; a reservation for an earlier slot is made
                 again when its holder confirms it
  generation     bumped by the first throttle of a burst and by a new config; a reservation
                 from an older generation is made again, and a throttle reported for a grant
                 from an older generation is ignored (one decrease per burst). A state without
                 one (new, reset) starts at Redis TIME in µs, so a number handed out before a
                 reset is never handed out again after it (see load_state)
  wmax, wstart, decreased_at   adaptive rate: the rate the climb after the last decrease
                 heads for, the rate it started from, and when it started
  learned, learn_sure   the real limit learned from throttles (requests per period) and
                 whether it was measured over enough grants to hold under it (see "Learning the
                 real limit" below); absent until measured
  learn_target, learn_from, learn_grants   the learning rate since the last accepted throttle
                 starts at learn_target from learn_from (when sending resumed after its block,
                 or after an idle spell: resume_after_idle); n_grants was learn_grants then
  learn_base_us, learn_base_grants   the shortest interval measured (resume to throttle) and the
                 grants the server accepted in it: mostly its burst, subtracted from the others
  learn_base_gen, learn_base_late   the generation of that interval's grants, and how many of
                 them were reported 429 after its throttle (sent while it was in flight)
  n_<event>      running counts for metrics (COUNTERS below), kept here so that every worker
                 on every machine adds to one total without an extra round trip
  sampled_at     when the rate history (below, "Rate history") was last sampled
  w<i>_tat_us/_frac, w<i>_granted_tat_us/_frac, w<i>_generation
                 the same schedules for window i of the config's `windows` (1-based): every
                 grant must also conform to each window. A window's reservations belong to the
                 generation in w<i>_generation; read under a newer one, its tat restarts from
                 its granted tat, as the main schedule's does in new_generation.

Windows: besides rate per period, the config may list windows "rate,period,burst,unit;...".
A request takes `weight` units of each "requests" window and its `cost` units of each "cost"
window (tokens); a window it takes nothing from does not hold it back. The adaptive rate and
the generations are the main rate's; blocks stop every window.
]]

-- Redis < 5 replicates scripts verbatim, which TIME makes non-deterministic; later versions
-- replicate effects and keep this function only as a no-op.
if redis.replicate_commands then
  pcall(redis.replicate_commands)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A number as Redis replies carry it without losing precision (Lua numbers become integers).
local function as_string(x)
  return string.format('%.17g', x)
end

-- The config's windows ("rate,period,burst,unit;..."), each with its interval in µs per unit.
local function parse_windows(spec)
  local windows = {}
  for rate, period, burst, unit in string.gmatch(spec or '', '([^,;]+),([^,;]+),([^,;]+),([^,;]+)') do
    local w = {rate = tonumber(rate), period = tonumber(period), burst = tonumber(burst),
      unit = unit, cost = unit == 'cost'}
    w.interval = w.period * 1000000 / w.rate
    windows[#windows + 1] = w
  end
  return windows
end

local function load_config(key)
  local v = redis.call('HMGET', key, 'rate', 'period', 'burst', 'max_concurrency', 'adaptive',
    'min_rate', 'decrease_factor', 'recovery_seconds', 'version', 'windows', 'learn')
  if not v[1] then
    return nil
  end
  return {
    windows = parse_windows(v[10]),
    rate = tonumber(v[1]),
    period = tonumber(v[2]),
    burst = tonumber(v[3]),
    max_concurrency = tonumber(v[4]),
    adaptive = v[5] == '1',
    min_rate = tonumber(v[6]),
    decrease_factor = tonumber(v[7]),
    recovery_seconds = tonumber(v[8]),
    version = tonumber(v[9]) or 0,
    learn = v[11] ~= '0',
  }
end

-- The stored limits are older than the caller's (changed while Redis was down, or rolled back
-- by a Redis restored from an old snapshot): the caller must configure before anything is
-- granted, so the database's limits win. caller_version 0 (unversioned) accepts any.
local function config_outdated(cfg, caller_version)
  return cfg.version < (tonumber(caller_version) or 0)
end

-- Schedule times in the returned state are offsets from `now` (exact at that small magnitude);
-- store_times turns them back into whole microseconds plus a fraction. A state that has no
-- generation yet (new, or reset) starts at `now`: generations go up by one per throttle burst
-- or change, far slower than the clock, so every reservation and grant from before a reset
-- holds a lower number than any after it. It is stored at once (unless `read_only`), or the
-- next call would start another.
local function load_state(key, now, read_only)
  local v = redis.call('HMGET', key, 'tat_us', 'tat_frac', 'granted_tat_us', 'granted_tat_frac',
    'blocked_until', 'generation', 'wmax', 'wstart', 'decreased_at', 'learned', 'learn_sure',
    'learn_target', 'learn_from', 'learn_grants', 'learn_base_us', 'learn_base_grants',
    'learn_base_gen', 'learn_base_late', 'sampled_at')
  local generation = tonumber(v[6])
  if not generation then
    generation = now
    if not read_only then
      redis.call('HSET', key, 'generation', generation)
    end
  end
  return {
    tat = ((tonumber(v[1]) or 0) - now) + (tonumber(v[2]) or 0),
    granted_tat = ((tonumber(v[3]) or 0) - now) + (tonumber(v[4]) or 0),
    blocked_until = tonumber(v[5]) or 0,
    generation = generation,
    wmax = tonumber(v[7]),
    wstart = tonumber(v[8]),
    decreased_at = tonumber(v[9]),
    learned = tonumber(v[10]),
    learn_sure = v[11] == '1',
    learn_target = tonumber(v[12]),
    learn_from = tonumber(v[13]),
    learn_grants = tonumber(v[14]),
    learn_base_us = tonumber(v[15]),
    learn_base_grants = tonumber(v[16]),
    learn_base_gen = tonumber(v[17]),
    learn_base_late = tonumber(v[18]) or 0,
    sampled_at = tonumber(v[19]) or 0,
  }
end

local function store_time(key, name, now, offset)
  local whole = math.floor(offset)
  redis.call('HSET', key, name .. '_us', now + whole, name .. '_frac', offset - whole)
end

-- Each window's schedule as offsets from now, into st.w (call after load_state).
local function load_windows(key, cfg, st, now)
  st.w = {}
  for i = 1, #cfg.windows do
    local p = 'w' .. i .. '_'
    local v = redis.call('HMGET', key, p .. 'tat_us', p .. 'tat_frac', p .. 'granted_tat_us',
      p .. 'granted_tat_frac', p .. 'generation')
    local granted = ((tonumber(v[3]) or now) - now) + (tonumber(v[4]) or 0)
    local tat = ((tonumber(v[1]) or now) - now) + (tonumber(v[2]) or 0)
    if tonumber(v[5]) ~= st.generation then
      tat = granted
    end
    st.w[i] = {tat = tat, granted = granted}
  end
  st.cost_seq = tonumber(redis.call('HGET', key, 'cost_seq')) or 0
end

local function store_windows(key, st, now)
  local fields = {}
  for i, w in ipairs(st.w) do
    local p = 'w' .. i .. '_'
    for name, offset in pairs({tat = w.tat, granted_tat = w.granted}) do
      local whole = math.floor(offset)
      fields[#fields + 1] = p .. name .. '_us'
      fields[#fields + 1] = now + whole
      fields[#fields + 1] = p .. name .. '_frac'
      fields[#fields + 1] = offset - whole
    end
    fields[#fields + 1] = p .. 'generation'
    fields[#fields + 1] = st.generation
  end
  if #fields > 0 then
    fields[#fields + 1] = 'cost_seq'
    fields[#fields + 1] = st.cost_seq
    redis.call('HSET', key, unpack(fields))
  end
end

-- Refunds (settle.lua) need, for each cost window, the headroom every later reservation had:
-- how far the window's schedule was past that reservation's slot. The API counted the call at
-- its real cost from the start, so its schedule ran ahead of ours by the refund only until a
-- reservation with less headroom than that: there the API's bucket was full, the difference
-- was gone, and giving it back now would let through more than the burst. The history keeps
-- the last HEADROOM_KEPT entries (member "<window>:<seq>:<headroom µs>", score seq).
-- A reservation's seq is at least Redis TIME in µs when it is made (next_cost_seq), so that
-- after a reset, which forgets cost_seq and the history, a refund for a grant from before it
-- is older than the whole new history and gives nothing back.
local HEADROOM_KEPT = 4096

local function next_cost_seq(st, now)
  st.cost_seq = math.max(st.cost_seq + 1, now)
end

local function record_headroom(heads_key, st, i, headroom)
  redis.call('ZADD', heads_key, st.cost_seq,
    i .. ':' .. as_string(st.cost_seq) .. ':' .. headroom)
end

-- Give back `units` of each cost window taken by the reservation numbered `seq` (a refund, or
-- a reservation that went stale and will never be sent), capped by the least headroom of the
-- reservations made since it (none when the history no longer holds its own entry); what is
-- given back is used up from those headrooms, so two refunds never give back more than one
-- could. The units come off the schedules that counted them: a granted call's are in both the
-- reserved and the granted schedule, a stale reservation's only in the reserved one (`granted`
-- false), or the next generation, restarting from the granted schedule, would give them back a
-- second time. Changes st.w; the caller stores it.
local function give_back(heads_key, cfg, st, seq, units, granted)
  if seq < 0 or units <= 0 then
    return
  end
  local oldest = redis.call('ZRANGE', heads_key, 0, 0, 'WITHSCORES')
  if #oldest == 0 or tonumber(oldest[2]) > seq then
    return
  end
  local later = redis.call('ZRANGEBYSCORE', heads_key, '(' .. as_string(seq), '+inf',
    'WITHSCORES')
  local least = {}
  for k = 1, #later, 2 do
    local i, headroom = string.match(later[k], '^(%d+):%d+:(%d+)$')
    i = tonumber(i)
    least[i] = math.min(least[i] or math.huge, tonumber(headroom))
  end
  local given = {}
  for i, win in ipairs(cfg.windows) do
    if win.cost then
      local w = st.w[i]
      local shift = math.min(units * win.interval, least[i] or math.huge)
      given[i] = math.floor(shift)
      w.tat = math.max(w.tat - shift, math.min(w.tat, 0))
      if granted then
        w.granted = math.max(w.granted - shift, math.min(w.granted, 0))
      end
    end
  end
  for k = 1, #later, 2 do
    local i, rest, headroom = string.match(later[k], '^(%d+):(%d+):(%d+)$')
    local used = given[tonumber(i)] or 0
    if used > 0 then
      redis.call('ZREM', heads_key, later[k])
      redis.call('ZADD', heads_key, later[k + 1],
        i .. ':' .. rest .. ':' .. math.max(0, tonumber(headroom) - used))
    end
  end
end

-- Units a request takes from window `win`: its weight, or its cost in a cost window.
local function window_units(win, weight, cost)
  if win.cost then
    return cost or 0
  end
  return weight
end

-- Learning the real limit (adaptive with cfg.learn, the default). Against an API that enforces
-- less than it advertises, CUBIC saws around the real limit (cut to 0.7, climb back, overshoot:
-- about 0.85 of it on average). Learning measures the limit at each accepted throttle instead and
-- holds just under it.
--
-- The measurement: sending resumes after a throttle's block with the server's bucket full
-- again; from then (learn_from) to the next accepted throttle the server accepted every grant
-- but the throttled one. A GCRA server of real rate R and burst b accepts b + R * span while we
-- push above R, so two such intervals give R as the slope (grants - base grants) /
-- (span - base span), the base being the shortest interval seen (mostly the server's burst).
-- That holds when the interval started above R (the slope comes out at or below the rate
-- sending resumed at). When it started below R and climbed past it, the throttle came once the
-- climb's excess over R used up the burst b (estimated from the base): R = rate_before -
-- sqrt(2 * b * slope of the climb). An interval in which the workers sent less than LEARN_BUSY
-- of what the rate allowed (idle, or held back by something else) says nothing about the server
-- and is skipped.
--
-- The rate after an accepted throttle starts at learn_target from learn_from:
--   nothing learned yet: decrease_factor times the rate before, climbing by LEARN_CLIMB times
--     it per recovery_seconds (discovery, like CUBIC's cuts);
--   a rough estimate (fewer than LEARN_PRECISE_GRANTS grants between the two intervals, and
--     nothing sure learned before): the estimate, climbing the same way, so that the next
--     throttle measures over a longer span; once sure, a rough measurement at or above
--     decrease_factor of the rate corrects the estimate and keeps it sure;
--   learned: LEARN_HOLD times it, creeping up by LEARN_PROBE * (t / recovery_seconds)^3, so a
--     raised limit is found while a steady one is crossed only after about two recovery periods
--     (a throttle reached so, below the rate it came at, keeps the learned limit unless the
--     estimate is higher).
-- A throttle never raises the rate; decrease_factor's cut and the one-decrease-per-burst rule
-- (generations) apply as with CUBIC; CUBIC's fields are kept up to date too, so turning learn off
-- falls back to CUBIC from the last cut.
-- Measured limits are within 1-2 % of the real one (bench/adaptive.py); holding 2 % under it
-- leaves no 429s until the probe crosses it.
local LEARN_HOLD = 0.98
-- While finding the limit the rate climbs by twice where it started per recovery period (10 %/s
-- at the default 20 s): a limit 20-30 % above is met within a few seconds, and the overshoot
-- the estimate subtracts (sqrt(2 * b * slope)) stays a few per cent.
local LEARN_CLIMB = 2.0
-- A steady limit held at LEARN_HOLD is crossed after (0.02 / LEARN_PROBE)^(1/3) ~ 2.2 recovery
-- periods: one throttle (and its block, a second or more) every ~45 s at the default 20 s, ~2 %.
local LEARN_PROBE = 0.002
-- Grants the slope is measured over before it counts as learned: a count is off by one or two
-- (429s in flight), 2-4 % of 50.
local LEARN_PRECISE_GRANTS = 50
-- Intervals closer in length than this give a slope of mostly counting noise.
local LEARN_MIN_SPAN_US = 100000
-- An interval counts when the workers took at least this share of the grants the rate allowed:
-- they kept pushing, so the server's answers measure the server, not an idle job.
local LEARN_BUSY = 0.9

-- The instant the learning rate is read at: `now` while sending, else when the API became idle
-- (nothing granted for a whole period). Probing upward with nothing sent measures nothing, and
-- a rate that climbed to the ceiling through an idle spell would start the next job with a 429.
local function learning_now(cfg, st, now)
  return now + math.min(0, st.granted_tat + cfg.period * 1000000)
end

-- The learning rate t µs after learn_from, and its slope (requests per period, per period).
local function learning_rate(cfg, st, now)
  now = learning_now(cfg, st, now)
  local t = math.max(0, now - st.learn_from) / (cfg.recovery_seconds * 1000000)
  if st.learn_sure then
    return st.learn_target * (1 + LEARN_PROBE * t * t * t)
  end
  return st.learn_target * (1 + LEARN_CLIMB * t)
end

local function learning_slope(cfg, st, now)
  now = learning_now(cfg, st, now)
  local t = math.max(0, now - st.learn_from) / (cfg.recovery_seconds * 1000000)
  local per_period = cfg.period / cfg.recovery_seconds
  if st.learn_sure then
    return st.learn_target * 3 * LEARN_PROBE * t * t * per_period
  end
  return st.learn_target * LEARN_CLIMB * per_period
end

-- The first acquire after an idle spell starts learning's phase again from the rate it stood at,
-- as sending after a throttle's block does: the server's bucket refilled meanwhile, so the span
-- from here to the next throttle measures the server as learn_from_throttle expects, and the
-- probe's clock counts time spent sending, not time idle.
local function resume_after_idle(state_key, cfg, st, now)
  if not (cfg.adaptive and cfg.learn and st.learn_target and st.learn_from) then
    return
  end
  if now <= st.learn_from or learning_now(cfg, st, now) >= now then
    return
  end
  st.learn_target = math.max(cfg.min_rate, math.min(cfg.rate, learning_rate(cfg, st, now)))
  st.learn_from = now
  st.learn_grants = tonumber(redis.call('HGET', state_key, 'n_grants')) or 0
  redis.call('HSET', state_key, 'learn_target', as_string(st.learn_target), 'learn_from', now,
    'learn_grants', st.learn_grants)
end

-- Grants the learning rate allowed in the `span` µs after learn_from (its integral).
local function learning_allowance(cfg, st, span)
  local k = cfg.recovery_seconds
  local t = span / 1000000
  local units
  if st.learn_sure then
    units = t + LEARN_PROBE * t * t * t * t / (4 * k * k * k)
  else
    units = t + LEARN_CLIMB * t * t / (2 * k)
  end
  return math.min(st.learn_target * units, cfg.rate * t) / cfg.period
end

-- The adaptive rate: learning's (above) when it has started, else CUBIC (as AWS's adaptive
-- retry mode): right after a decrease it is wstart (decrease_factor times the rate before), it
-- climbs back to wmax in recovery_seconds, then probes above it. Always within [min_rate, rate].
local function current_rate(cfg, st, now)
  if not cfg.adaptive then
    return cfg.rate
  end
  local r
  if cfg.learn and st.learn_target and st.learn_from then
    r = learning_rate(cfg, st, now)
  elseif st.wmax and st.decreased_at then
    local k = cfg.recovery_seconds
    local scale = (st.wmax - (st.wstart or st.wmax * cfg.decrease_factor)) / (k * k * k)
    local d = (now - st.decreased_at) / 1000000 - k
    r = st.wmax + scale * d * d * d
  else
    return cfg.rate
  end
  return math.max(cfg.min_rate, math.min(cfg.rate, r))
end

local function interval_us(cfg, rate)
  return cfg.period * 1000000 / rate
end

-- Start a new generation: outstanding reservations become stale, so the schedule restarts from
-- what was actually granted instead of wasting the stale slots.
local function new_generation(state_key, st, now)
  st.generation = st.generation + 1
  st.tat = st.granted_tat
  redis.call('HSET', state_key, 'generation', st.generation)
  store_time(state_key, 'tat', now, st.tat)
end

-- The events counted in the state hash, in the order state.lua returns them.
local COUNTERS = {'grants', 'waits', 'wait_us', 'too_long', 'at_capacity', 'throttles',
  'blocks', 'decreases'}

-- Returns the new count.
local function count(state_key, event, by)
  return redis.call('HINCRBY', state_key, 'n_' .. event, by or 1)
end

-- Rate history: the adaptive rate over time, for the operator's chart (Limiter.rate_history).
-- A sorted set (the scripts' history key, scored by µs) of members
-- "<at_us>:<rate>:<period>:<grants>": the rate granted at (requests per period) and the grants
-- counter then, so two samples also give the grants between them. Grants add a sample at most
-- every `every` µs (the time of the last one is the state's sampled_at, read with the rest of
-- the state: a grant between samples costs nothing more); an accepted rate cut always adds
-- two, the rate just before it and the rate after, so the cut shows at once and as a step.
-- The set keeps the newest `kept` samples. st.history is {key, every, kept}, or nil when the
-- caller passed none (then nothing is sampled); set it with use_history.
local function use_history(st, key, every, kept)
  every, kept = tonumber(every), tonumber(kept)
  if key and every and kept and kept > 0 then
    st.history = {key = key, every = every, kept = kept}
  end
end

local function add_samples(state_key, st, now, samples)
  local args = {}
  for _, sample in ipairs(samples) do
    local at, rate, period, grants = sample[1], sample[2], sample[3], sample[4]
    args[#args + 1] = at
    -- as_string, not '..': Lua's own number format keeps 14 digits, a µs time has 16
    args[#args + 1] = as_string(at) .. ':' .. as_string(rate) .. ':' .. as_string(period) .. ':'
      .. as_string(grants)
  end
  redis.call('ZADD', st.history.key, unpack(args))
  redis.call('ZREMRANGEBYRANK', st.history.key, 0, -st.history.kept - 1)
  -- The chart shows what the kept samples span at one per `every`; an API idle that long has
  -- no history worth drawing, and the key leaves Redis.
  redis.call('PEXPIRE', st.history.key, math.ceil(st.history.kept * st.history.every / 1000))
  redis.call('HSET', state_key, 'sampled_at', now)
  st.sampled_at = now
end

-- After a grant (`grants` is the counter now): a sample when the last is `every` µs old.
local function sample_grant(state_key, cfg, st, now, grants)
  if st.history and now - st.sampled_at >= st.history.every then
    add_samples(state_key, st, now, {{now, current_rate(cfg, st, now), cfg.period, grants}})
  end
end

-- After the feedback scripts' signals, when they cut the rate (apply_feedback sets st.cut_from
-- to the rate before the first cut): the rate before and after, 1 µs apart, whatever the
-- spacing; several cuts at one instant (feedback_many) make one step.
local function sample_cut(state_key, cfg, st, now)
  if st.history and st.cut_from then
    local grants = tonumber(redis.call('HGET', state_key, 'n_grants')) or 0
    add_samples(state_key, st, now, {{now - 1, st.cut_from, cfg.period, grants},
      {now, current_rate(cfg, st, now), cfg.period, grants}})
  end
end

-- GCRA with reservation: the earliest slot at which `weight` more units conform, as an offset
-- from now. Rounded up to a whole microsecond so that a slot survives the trip to the caller
-- and back exactly.
local function next_slot_offset(cfg, st, now, weight, interval, cost)
  local offset = math.max(0, st.blocked_until - now, st.tat - (cfg.burst - weight) * interval)
  for i, win in ipairs(cfg.windows) do
    local units = window_units(win, weight, cost)
    if units > 0 then
      offset = math.max(offset, st.w[i].tat - (win.burst - units) * win.interval)
    end
  end
  return math.ceil(offset)
end

-- Why a request of `weight` and `cost` can never be granted (more than some burst), or nil.
-- The reply starts with the error code TOOBIG, by which callers tell it from a Redis failure:
-- no wait and no retry makes room for it (P3).
local function too_big(cfg, weight, cost)
  if weight > cfg.burst then
    return 'TOOBIG weight ' .. weight .. ' exceeds burst ' .. cfg.burst
  end
  for _, win in ipairs(cfg.windows) do
    local units = window_units(win, weight, cost)
    if units > win.burst then
      return 'TOOBIG ' .. (win.cost and 'cost ' or 'weight ') .. units .. ' exceeds the burst '
        .. win.burst .. ' of window ' .. win.rate .. '/' .. win.period .. 's'
    end
  end
  return nil
end

-- A request whose slot is further than the caller waits keeps it anyway (the caller asked to,
-- and comes back to confirm it) when the slot is within KEEP_PLACE_SPANS times the time its
-- own units take to refill beyond that wait. Otherwise a large request starves: it fits only
-- when a window is nearly full, and smaller ones keep taking what refills within their wait.
-- Reserved, its units are taken at the slot and later requests queue behind it (P5).
-- Waiting behind the horizon of smaller calls costs at most its own refill time, so one span
-- would do with no other kept place ahead; four let it queue behind three as large as itself
-- (a job's large calls come to the window together), while the schedule held for callers that
-- are away stays a few refill times long: what holders that never come back can waste.
local KEEP_PLACE_SPANS = 4

local function keeps_place(cfg, keep, weight, cost, interval, wait, max_wait)
  if not keep then
    return false
  end
  local own = weight * interval
  for _, win in ipairs(cfg.windows) do
    own = math.max(own, window_units(win, weight, cost) * win.interval)
  end
  return wait <= max_wait + KEEP_PLACE_SPANS * own
end


-- The acquire scripts' steps (acquire.lua one slot at a time, acquire_many.lua several).
-- `keys` is their KEYS: config hash, state hash, leases sorted set, released list. Schedule
-- changes are made to `st` in memory; the script stores them once at its end (store_time).

-- A reservation survives until its holder confirms it unless a block now covers its slot, a
-- throttle or new config started a new generation since it was made, or the holder comes a
-- whole slot late (a paused process, a starved core): sent now, its request would land right
-- beside the next on-time one, so it queues again instead.
-- A holder may confirm this much before its slot: it is granted the slot and sleeps the rest
-- itself (acquire.lua's GRANTED with a wait), so its request leaves at the slot rather than a
-- round trip after it. Confirming at the slot, a holder was always a round trip late, more
-- than a whole slot at a fast main rate (100 µs at 10,000/s): its reservation never held, and
-- a kept place (P5) went to the back of the queue at every try. Blocks and rate cuts that come
-- in these last milliseconds find it already granted, as a grant made just before them.
local CONFIRM_AHEAD_US = 5000

local function reservation_holds(st, now, held_slot, held_generation, weight, interval)
  return held_slot >= st.blocked_until and held_generation == st.generation
    and now - held_slot < weight * interval
end

-- Send now at `slot` (<= now): the lease runs from now, and the granted schedule moves past it.
local function grant_slot(keys, cfg, st, now, lease_id, ttl, slot, weight, interval, cost)
  redis.call('ZADD', keys[3], now + ttl, lease_id)
  st.granted_tat = math.max(st.granted_tat, slot - now) + weight * interval
  for i, win in ipairs(cfg.windows) do
    local units = window_units(win, weight, cost)
    if units > 0 then
      st.w[i].granted = math.max(st.w[i].granted, slot - now) + units * win.interval
    end
  end
  sample_grant(keys[2], cfg, st, now, count(keys[2], 'grants'))
end

-- Take the slot `wait` from now (next_slot_offset's answer) with its lease: granted at once when
-- wait is 0, else held until its holder confirms it; the lease of a held slot runs from the slot.
local function reserve_slot(keys, cfg, st, now, lease_id, ttl, wait, weight, interval, cost)
  st.tat = math.max(st.tat, wait) + weight * interval
  local costed = false
  for i, win in ipairs(cfg.windows) do
    local units = window_units(win, weight, cost)
    if units > 0 then
      if win.cost then
        if not costed then
          next_cost_seq(st, now)
          costed = true
        end
        record_headroom(keys[5], st, i, math.floor(math.max(0, st.w[i].tat - wait)))
      end
      st.w[i].tat = math.max(st.w[i].tat, wait) + units * win.interval
    end
  end
  if costed then
    redis.call('ZREMRANGEBYRANK', keys[5], 0, -HEADROOM_KEPT - 1)
  end
  if wait == 0 then
    grant_slot(keys, cfg, st, now, lease_id, ttl, now, weight, interval, cost)
    return
  end
  redis.call('ZADD', keys[3], now + wait + ttl, lease_id)
  count(keys[2], 'waits')
  count(keys[2], 'wait_us', wait)
end

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

-- An accepted throttle as a measurement of the real limit (see "Learning the real limit" above):
-- update the estimate, then start the next phase at learn_target from when sending resumes.
local function learn_from_throttle(keys, cfg, st, now, rate_before)
  local grants = tonumber(redis.call('HGET', keys[2], 'n_grants')) or 0
  local span = now - (st.learn_from or now)
  if st.learn_target and span > 0 then
    local accepted = grants - st.learn_grants - 1
    if accepted >= LEARN_BUSY * learning_allowance(cfg, st, span) then
      local period_us = cfg.period * 1000000
      local base_us, base = st.learn_base_us, st.learn_base_grants
      if base_us and span - base_us >= LEARN_MIN_SPAN_US and accepted > base then
        local slope = (accepted - base) * period_us / (span - base_us)
        local resumed_at = math.max(cfg.min_rate, math.min(cfg.rate, st.learn_target))
        if slope <= resumed_at then
          -- One measurement cuts no deeper than CUBIC would: a 429 for another reason (another
          -- limit, an outage) makes a line of any slope, and the climb finds the limit again.
          -- A throttle while holding a sure estimate corrects it (down) rather than starting
          -- the search again: a measurement over too few grants to be precise still keeps it
          -- sure, or the climb that follows overshoots and throttles every few seconds.
          local floor = rate_before * cfg.decrease_factor
          st.learned = math.max(slope, floor)
          st.learn_sure = slope >= floor
            and (st.learn_sure or accepted - base >= LEARN_PRECISE_GRANTS)
        else
          -- the base's grants sent while its throttle was in flight were 429s too
          local burst = math.max(1, base - st.learn_base_late - slope * base_us / period_us)
          local overshoot = math.sqrt(2 * burst * learning_slope(cfg, st, now))
          local estimate = math.max(resumed_at, rate_before - overshoot)
          -- A learned limit below the rate throttled at still fits (arrivals bunch up in
          -- transit, so the slow probe meets the limit a little early): keep it unless the
          -- limit rose.
          if not st.learned or estimate > st.learned or st.learned >= rate_before then
            st.learned = estimate
          end
          st.learn_sure = true
        end
        st.learned = math.min(st.learned, cfg.rate)
      end
      if not base_us or span < base_us then
        st.learn_base_us, st.learn_base_grants = span, accepted
        st.learn_base_gen, st.learn_base_late = st.generation, 0
      end
    end
  end
  local target = rate_before * cfg.decrease_factor
  if st.learned and st.learn_sure then
    target = st.learned * LEARN_HOLD
  elseif st.learned then
    target = st.learned
  end
  st.learn_target = math.min(target, rate_before)
  st.learn_from = math.max(now, st.blocked_until)
  st.learn_grants = grants
  local fields = {'learn_target', as_string(st.learn_target), 'learn_from', st.learn_from,
    'learn_grants', grants, 'learn_sure', st.learn_sure and '1' or '0'}
  if st.learned then
    fields[#fields + 1] = 'learned'
    fields[#fields + 1] = as_string(st.learned)
  end
  if st.learn_base_us then
    for _, name in ipairs({'learn_base_us', 'learn_base_grants', 'learn_base_gen',
        'learn_base_late'}) do
      fields[#fields + 1] = name
      fields[#fields + 1] = st[name]
    end
  end
  redis.call('HSET', keys[2], unpack(fields))
end

-- What feedback.lua and feedback_many.lua do with one signal: block everyone for `block` µs
-- and/or, for a throttle (a 429) about a grant of the current generation (or of none), start a
-- new generation and, when adaptive, cut the rate. A throttle about an older generation's grant
-- belongs to a burst already counted, which is how a burst of 429s cuts the rate only once.
-- Returns accepted (1 or 0) and the rate before the signal.
local function apply_feedback(keys, cfg, st, now, generation, block, throttled)
  local rate_before = current_rate(cfg, st, now)
  local accepted = 0
  if block > 0 then
    count(keys[2], 'blocks')
  end
  if throttled then
    count(keys[2], 'throttles')
  end
  if block > 0 and now + block > st.blocked_until then
    st.blocked_until = now + block
    redis.call('HSET', keys[2], 'blocked_until', st.blocked_until)
  end
  if throttled and (generation < 0 or generation == st.generation) then
    accepted = 1
    if cfg.adaptive then
      -- CUBIC's fast convergence: throttled below the last peak means the real limit is lower
      -- than that peak, so the climb heads for a point between the two and flattens out sooner.
      if st.wmax and rate_before < st.wmax then
        st.wmax = rate_before * (1 + cfg.decrease_factor) / 2
      else
        st.wmax = rate_before
      end
      st.wstart = rate_before * cfg.decrease_factor
      st.decreased_at = now
      redis.call('HSET', keys[2], 'wmax', as_string(st.wmax), 'wstart', as_string(st.wstart),
        'decreased_at', now)
      if cfg.learn then
        learn_from_throttle(keys, cfg, st, now, rate_before)
      end
      count(keys[2], 'decreases')
      st.cut_from = st.cut_from or rate_before
    end
    new_generation(keys[2], st, now)
  elseif throttled and cfg.adaptive and cfg.learn and generation == st.learn_base_gen then
    st.learn_base_late = st.learn_base_late + 1
    redis.call('HSET', keys[2], 'learn_base_late', st.learn_base_late)
  end
  return accepted, rate_before
end

-- Lifetimes: every key of a bucket expires once nothing in it can matter any more, so the
-- bucket of a key nobody uses leaves Redis. Its next use finds no config (NOT_CONFIGURED), the
-- caller writes its limits (the database's), and the bucket starts full: what the forgotten
-- state would have said by then, since the expiry is no earlier than
--   every window's span: a grant is remembered for the window's period, or for the time its
--     burst takes to refill when that is longer, so no spent quota is handed back;
--   the schedules' ends (reservations far ahead, a charge settled later);
--   the end of every lease (a reservation's runs from its slot), of a block, and of the
--     adaptive rate's climb back to its ceiling after a cut.
-- The scripts that do not see every lease (feedback, settle, configure) never shorten what the
-- acquire scripts set, so an expiry is the latest any script computed; each is bounded by the
-- limits, the longest lease asked for and the longest block.
-- The margin: Redis never expires a key early on its own clock, the scripts' clock; it covers
-- rounding to ms and a replica's clock a little behind after a failover.
local LIFETIME_MARGIN_US = 1000000
-- A learned limit is a fact about the API, not about its last burst: it is kept through idle
-- spells (the rate stands still meanwhile: resume_after_idle) for this long after the bucket's
-- last use, so tomorrow's job starts at the held rate rather than at the ceiling, into a 429.
local LEARNED_KEPT_US = 24 * 3600 * 1000000

local function window_span_us(rate, period, burst)
  return math.max(period, burst * period / rate) * 1000000
end

-- When the adaptive rate is back at the ceiling for good (it only climbs between cuts): 0 when
-- it was never cut. Solves current_rate's formulas for cfg.rate.
local function rate_recovered_at(cfg, st)
  if not cfg.adaptive then
    return 0
  end
  local k = cfg.recovery_seconds
  if cfg.learn and st.learn_target and st.learn_from then
    local gap = math.max(0, cfg.rate / math.max(st.learn_target, 1e-9) - 1)
    local t = st.learn_sure and (gap / LEARN_PROBE) ^ (1 / 3) or gap / LEARN_CLIMB
    return st.learn_from + t * k * 1000000
  end
  if st.wmax and st.decreased_at then
    local scale = (st.wmax - (st.wstart or st.wmax * cfg.decrease_factor)) / (k * k * k)
    if scale <= 0 then
      return st.decreased_at + k * 1000000
    end
    local x = (cfg.rate - st.wmax) / scale
    local d = x >= 0 and x ^ (1 / 3) or -((-x) ^ (1 / 3))
    return st.decreased_at + (k + d) * 1000000
  end
  return 0
end

-- Refund history bounded by time: at a mark (heads_seq, heads_until in the state hash) the
-- history's newest seq and the bucket's expiry then are noted; once that expiry has passed,
-- every reservation before the mark has left every window and its lease has ended, so its
-- entries go (a refund for it gives back nothing, as when the count cap dropped it). Entries
-- live one to two lifetimes; the mark's own seq stays, so the history is never emptied.
local function trim_heads(state_key, heads_key, st, now, expires_at)
  local mark = redis.call('HMGET', state_key, 'heads_seq', 'heads_until')
  local seq, mark_until = tonumber(mark[1]), tonumber(mark[2])
  if mark_until and now < mark_until then
    return
  end
  if seq then
    redis.call('ZREMRANGEBYSCORE', heads_key, '-inf', '(' .. seq)
  end
  redis.call('HSET', state_key, 'heads_seq', st.cost_seq, 'heads_until', expires_at)
end

-- Renewing every key at every grant would add several Redis calls to each, so an expiry is set
-- this much past what is needed (or a quarter of the longest span, when longer), and the calls
-- within it renew only the keys they may have made again.
local RENEW_SLACK_US = 1000000

-- Renew the expiry of a bucket's keys after a script wrote to them. keys: {config, state, ...}
-- as the script was given them; config and state are always renewed together, so the state's
-- expiry is theirs. lease_end: the latest end of a lease this call took (0 for none).
-- heads_key: the refund history (renewed and bounded in time with cost windows), or nil.
local function renew_bucket(keys, cfg, st, now, lease_end, heads_key)
  local at = math.max(now + st.tat, now + st.granted_tat, st.blocked_until,
    rate_recovered_at(cfg, st), lease_end)
  if cfg.adaptive and cfg.learn and st.learned then
    at = math.max(at, now + LEARNED_KEPT_US)
  end
  local span = window_span_us(cfg.rate, cfg.period, cfg.burst)
  local costed = false
  for i, win in ipairs(cfg.windows) do
    span = math.max(span, window_span_us(win.rate, win.period, win.burst))
    costed = costed or win.cost
    if st.w and st.w[i] then
      at = math.max(at, now + st.w[i].tat, now + st.w[i].granted)
    end
  end
  local need = math.ceil((math.max(at, now + span) + LIFETIME_MARGIN_US - now) / 1000)
  local ms = redis.call('PTTL', keys[2])
  local first = 3
  if ms < need then
    ms = need + math.ceil(math.max(RENEW_SLACK_US, span / 4) / 1000)
    first = 1
    if heads_key and costed and st.cost_seq and st.cost_seq > 0 then
      trim_heads(keys[2], heads_key, st, now, now + need * 1000)
    end
  end
  -- the others may be new since (a leases set emptied by releases and taken again)
  for i = first, #keys do
    redis.call('PEXPIRE', keys[i], ms)
  end
  if heads_key and costed then
    redis.call('PEXPIRE', heads_key, ms)
  end
end
