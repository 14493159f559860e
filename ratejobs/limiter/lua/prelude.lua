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
                 from an older generation is ignored (one decrease per burst)
  wmax, wstart, decreased_at   adaptive rate: the rate the climb after the last decrease
                 heads for, the rate it started from, and when it started
  n_<event>      running counts for metrics (COUNTERS below), kept here so that every worker
                 on every machine adds to one total without an extra round trip
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

local function load_config(key)
  local v = redis.call('HMGET', key, 'rate', 'period', 'burst', 'max_concurrency', 'adaptive',
    'min_rate', 'decrease_factor', 'recovery_seconds', 'version')
  if not v[1] then
    return nil
  end
  return {
    rate = tonumber(v[1]),
    period = tonumber(v[2]),
    burst = tonumber(v[3]),
    max_concurrency = tonumber(v[4]),
    adaptive = v[5] == '1',
    min_rate = tonumber(v[6]),
    decrease_factor = tonumber(v[7]),
    recovery_seconds = tonumber(v[8]),
    version = tonumber(v[9]) or 0,
  }
end

-- The stored limits are older than the caller's (changed while Redis was down, or rolled back
-- by a Redis restored from an old snapshot): the caller must configure before anything is
-- granted, so the database's limits win. caller_version 0 (unversioned) accepts any.
local function config_outdated(cfg, caller_version)
  return cfg.version < (tonumber(caller_version) or 0)
end

-- Schedule times in the returned state are offsets from `now` (exact at that small magnitude);
-- store_times turns them back into whole microseconds plus a fraction.
local function load_state(key, now)
  local v = redis.call('HMGET', key, 'tat_us', 'tat_frac', 'granted_tat_us', 'granted_tat_frac',
    'blocked_until', 'generation', 'wmax', 'wstart', 'decreased_at')
  return {
    tat = ((tonumber(v[1]) or 0) - now) + (tonumber(v[2]) or 0),
    granted_tat = ((tonumber(v[3]) or 0) - now) + (tonumber(v[4]) or 0),
    blocked_until = tonumber(v[5]) or 0,
    generation = tonumber(v[6]) or 0,
    wmax = tonumber(v[7]),
    wstart = tonumber(v[8]),
    decreased_at = tonumber(v[9]),
  }
end

local function store_time(key, name, now, offset)
  local whole = math.floor(offset)
  redis.call('HSET', key, name .. '_us', now + whole, name .. '_frac', offset - whole)
end

-- The adaptive rate follows CUBIC (as AWS's adaptive retry mode does): right after a decrease it
-- is wstart (decrease_factor times the rate before), it climbs back to wmax in
-- recovery_seconds, then probes above it, always within [min_rate, rate].
local function current_rate(cfg, st, now)
  if not cfg.adaptive or not st.wmax or not st.decreased_at then
    return cfg.rate
  end
  local k = cfg.recovery_seconds
  local scale = (st.wmax - (st.wstart or st.wmax * cfg.decrease_factor)) / (k * k * k)
  local d = (now - st.decreased_at) / 1000000 - k
  local r = st.wmax + scale * d * d * d
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

local function count(state_key, event, by)
  redis.call('HINCRBY', state_key, 'n_' .. event, by or 1)
end

-- GCRA with reservation: the earliest slot at which `weight` more units conform, as an offset
-- from now. Rounded up to a whole microsecond so that a slot survives the trip to the caller
-- and back exactly.
local function next_slot_offset(cfg, st, now, weight, interval)
  return math.ceil(math.max(0, st.blocked_until - now, st.tat - (cfg.burst - weight) * interval))
end


local function as_string(x)
  return string.format('%.17g', x)
end

-- The acquire scripts' steps (acquire.lua one slot at a time, acquire_many.lua several).
-- `keys` is their KEYS: config hash, state hash, leases sorted set, released list. Schedule
-- changes are made to `st` in memory; the script stores them once at its end (store_time).

-- A reservation survives until its holder confirms it unless a block now covers its slot, a
-- throttle or new config started a new generation since it was made, or the holder comes a
-- whole slot late (a paused process, a starved core): sent now, its request would land right
-- beside the next on-time one, so it queues again instead.
local function reservation_holds(st, now, held_slot, held_generation, weight, interval)
  return held_slot >= st.blocked_until and held_generation == st.generation
    and now - held_slot < weight * interval
end

-- Send now at `slot` (<= now): the lease runs from now, and the granted schedule moves past it.
local function grant_slot(keys, st, now, lease_id, ttl, slot, weight, interval)
  redis.call('ZADD', keys[3], now + ttl, lease_id)
  st.granted_tat = math.max(st.granted_tat, slot - now) + weight * interval
  count(keys[2], 'grants')
end

-- Take the slot `wait` from now (next_slot_offset's answer) with its lease: granted at once when
-- wait is 0, else held until its holder confirms it; the lease of a held slot runs from the slot.
local function reserve_slot(keys, st, now, lease_id, ttl, wait, weight, interval)
  st.tat = math.max(st.tat, wait) + weight * interval
  if wait == 0 then
    grant_slot(keys, st, now, lease_id, ttl, now, weight, interval)
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
      count(keys[2], 'decreases')
    end
    new_generation(keys[2], st, now)
  end
  return accepted, rate_before
end
