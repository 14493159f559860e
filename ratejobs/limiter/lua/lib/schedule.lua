--[[
lib/schedule.lua: GCRA with reservation over the main rate and every window: when the next slot
is, whether a request can ever fit, whether a reservation still holds, and granting or
reserving a slot.
]]

-- Units a request takes from window `win`: its weight, or its cost in a cost window.
local function window_units(win, weight, cost)
  if win.cost then
    return cost or 0
  end
  return weight
end

local function interval_us(cfg, rate)
  return cfg.period * 1000000 / rate
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

-- Leases exist only to hold an in-flight cap: without one a grant takes none, and its holder
-- has nothing to give back (a round trip per request saved, core.Grant.leased).
local function takes_lease(cfg)
  return cfg.max_concurrency > 0
end

-- Send now at `slot` (<= now): the lease runs from now, and the granted schedule moves past it.
local function grant_slot(keys, cfg, st, now, lease_id, ttl, slot, weight, interval, cost)
  if takes_lease(cfg) then
    redis.call('ZADD', keys[3], now + ttl, lease_id)
  end
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
  if takes_lease(cfg) then
    redis.call('ZADD', keys[3], now + wait + ttl, lease_id)
  end
  count(keys[2], 'waits')
  count(keys[2], 'wait_us', wait)
end

-- A caller that asks one slot at a time pays a round trip to reserve and another to confirm
-- whenever it must wait. Granted, it may take its next slot at once (a spare): asking again, it
-- only confirms that one, so a caller that keeps asking pays one round trip per grant, and the
-- spare queues as if it had asked at once. A spare nobody confirms wastes its slot, once: it
-- is made only without an in-flight cap (it would hold a place) and without windows besides
-- the main rate (it would take a unit of a window's quota, a token budget's among them), at a
-- main rate of at least one slot per SPARE_INTERVAL_US, and for a slot at most SPARE_WAIT_US
-- away; a slot within CONFIRM_AHEAD_US is left to the next ask, which is granted it in one
-- round trip anyway.
local SPARE_INTERVAL_US = 20000
local SPARE_WAIT_US = 1000000

-- Reserve the spare when asked for and allowed; its slot, or -1.
local function reserve_spare(keys, cfg, st, now, wanted, weight, interval)
  if not wanted or takes_lease(cfg) or #cfg.windows > 0 or interval > SPARE_INTERVAL_US then
    return -1
  end
  local wait = next_slot_offset(cfg, st, now, weight, interval, 0)
  if wait <= CONFIRM_AHEAD_US or wait > SPARE_WAIT_US then
    return -1
  end
  reserve_slot(keys, cfg, st, now, '', 0, wait, weight, interval, 0)
  return now + wait
end
