--[[
lib/state.lua: the live state hash, read into a table by field name and written back, its
generations and its event counters.

State hash fields (STATE_FIELDS lists those load_state reads):
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
                 real limit" in lib/adaptive.lua); absent until measured
  learn_target, learn_from, learn_grants   the learning rate's phase starts at learn_target
                 from learn_from (when sending first started, resumed after a throttle's block,
                 or after an idle spell: learning_phase_due); n_grants was learn_grants then
  learn_base_us, learn_base_grants   the shortest interval measured (resume to throttle) and the
                 grants the server accepted in it: mostly its burst, subtracted from the others
  learn_base_gen, learn_base_late   the generation of that interval's grants, and how many of
                 them were reported 429 after its throttle (sent while it was in flight)
  n_<event>      running counts for metrics (COUNTERS below), kept here so that every worker
                 on every machine adds to one total without an extra round trip
  sampled_at     when the rate history (lib/history.lua) was last sampled
  cost_seq       the number of the last reservation that took from a cost window
                 (lib/refunds.lua)
  heads_seq, heads_until   the refund history's trim mark (lib/lifetimes.lua)
  w<i>_tat_us/_frac, w<i>_granted_tat_us/_frac, w<i>_generation
                 the same schedules for window i of the config's `windows` (1-based): every
                 grant must also conform to each window. A window's reservations belong to the
                 generation in w<i>_generation; read under a newer one, its tat restarts from
                 its granted tat, as the main schedule's does in new_generation.
]]

-- The state hash fields load_state reads (the rest are read where they are used: the windows'
-- by load_windows, cost_seq by load_windows, the counters by count and state.lua).
local STATE_FIELDS = {'tat_us', 'tat_frac', 'granted_tat_us', 'granted_tat_frac',
  'blocked_until', 'generation', 'wmax', 'wstart', 'decreased_at', 'learned', 'learn_sure',
  'learn_target', 'learn_from', 'learn_grants', 'learn_base_us', 'learn_base_grants',
  'learn_base_gen', 'learn_base_late', 'sampled_at'}

-- Schedule times in the returned state are offsets from `now` (exact at that small magnitude);
-- store_times turns them back into whole microseconds plus a fraction. A state that has no
-- generation yet (new, or reset) starts at `now`: generations go up by one per throttle burst
-- or change, far slower than the clock, so every reservation and grant from before a reset
-- holds a lower number than any after it. It is stored at once (unless `read_only`), or the
-- next call would start another.
local function load_state(key, now, read_only)
  -- Named locals in STATE_FIELDS' order: a table by name would cost every grant a 19-entry
  -- table built and thrown away, on the Redis server's single thread.
  local tat_us, tat_frac, granted_tat_us, granted_tat_frac, blocked_until, gen, wmax, wstart,
    decreased_at, learned, learn_sure, learn_target, learn_from, learn_grants, learn_base_us,
    learn_base_grants, learn_base_gen, learn_base_late, sampled_at =
    unpack(redis.call('HMGET', key, unpack(STATE_FIELDS)))
  local generation = tonumber(gen)
  if not generation then
    generation = now
    if not read_only then
      redis.call('HSET', key, 'generation', generation)
    end
  end
  return {
    tat = ((tonumber(tat_us) or 0) - now) + (tonumber(tat_frac) or 0),
    granted_tat = ((tonumber(granted_tat_us) or 0) - now) + (tonumber(granted_tat_frac) or 0),
    blocked_until = tonumber(blocked_until) or 0,
    generation = generation,
    wmax = tonumber(wmax),
    wstart = tonumber(wstart),
    decreased_at = tonumber(decreased_at),
    learned = tonumber(learned),
    learn_sure = learn_sure == '1',
    learn_target = tonumber(learn_target),
    learn_from = tonumber(learn_from),
    learn_grants = tonumber(learn_grants),
    learn_base_us = tonumber(learn_base_us),
    learn_base_grants = tonumber(learn_base_grants),
    learn_base_gen = tonumber(learn_base_gen),
    learn_base_late = tonumber(learn_base_late) or 0,
    sampled_at = tonumber(sampled_at) or 0,
  }
end

local function store_time(key, name, now, offset)
  local whole = math.floor(offset)
  redis.call('HSET', key, name .. '_us', now + whole, name .. '_frac', offset - whole)
end

-- store_time for several of st's offsets (`names`) in one HSET: a grant stores two.
local function store_times(key, now, st, names)
  local fields = {}
  for _, name in ipairs(names) do
    local whole = math.floor(st[name])
    fields[#fields + 1] = name .. '_us'
    fields[#fields + 1] = now + whole
    fields[#fields + 1] = name .. '_frac'
    fields[#fields + 1] = st[name] - whole
  end
  redis.call('HSET', key, unpack(fields))
end


-- Set `changes` (field name to value, as a policy function returns them) in st and write them to
-- the state hash in one HSET: numbers as exact strings, booleans as '1' or '0'.
local function store_changes(key, st, changes)
  local fields = {}
  for name, value in pairs(changes) do
    st[name] = value
    if type(value) == 'boolean' then
      value = value and '1' or '0'
    elseif type(value) == 'number' then
      value = as_string(value)
    end
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
  if #fields > 0 then
    redis.call('HSET', key, unpack(fields))
  end
end

-- Each window's schedule as offsets from now, into st.w (call after load_state).
local function load_windows(key, cfg, st, now)
  st.w = {}
  for i = 1, #cfg.windows do
    local p = 'w' .. i .. '_'
    -- a window's fields in the state hash, each prefixed with w<i>_, into named locals
    local tat_us, tat_frac, granted_tat_us, granted_tat_frac, generation = unpack(redis.call(
      'HMGET', key, p .. 'tat_us', p .. 'tat_frac', p .. 'granted_tat_us',
      p .. 'granted_tat_frac', p .. 'generation'))
    local granted = ((tonumber(granted_tat_us) or now) - now) + (tonumber(granted_tat_frac) or 0)
    local tat = ((tonumber(tat_us) or now) - now) + (tonumber(tat_frac) or 0)
    if tonumber(generation) ~= st.generation then
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
