--[[
lib/refunds.lua: the cost windows' headroom history and giving units back from it (settle.lua's
refunds, and reservations that went stale).
]]

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

-- How far each cost window's schedule moves back when `units` are given back for a reservation:
-- `units` at the window's interval, capped by the least headroom among `later` (the history
-- entries of the reservations made since it, as ZRANGEBYSCORE ... WITHSCORES returns them).
-- Returns µs by window index, for cost windows only.
local function refund_shifts(cfg, units, later)
  local least = {}
  for k = 1, #later, 2 do
    local i, headroom = string.match(later[k], '^(%d+):%d+:(%d+)$')
    i = tonumber(i)
    least[i] = math.min(least[i] or math.huge, tonumber(headroom))
  end
  local shifts = {}
  for i, win in ipairs(cfg.windows) do
    if win.cost then
      shifts[i] = math.min(units * win.interval, least[i] or math.huge)
    end
  end
  return shifts
end

-- A window's schedules (offsets from now) moved back by `shift` µs, never from the future into
-- the past beyond now: the reserved one always, the granted one when the units were granted.
local function shifted_window(w, shift, granted)
  local moved = {tat = math.max(w.tat - shift, math.min(w.tat, 0)), granted = w.granted}
  if granted then
    moved.granted = math.max(w.granted - shift, math.min(w.granted, 0))
  end
  return moved
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
  local given = {}
  for i, shift in pairs(refund_shifts(cfg, units, later)) do
    st.w[i] = shifted_window(st.w[i], shift, granted)
    given[i] = math.floor(shift)
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

-- Correct what a granted request took from the cost windows once its real cost is known:
-- `delta` (real minus granted) above 0 moves each cost window's schedule later by it, as if
-- granted with the rest; below 0 gives it back from the grant's reservation `seq` within
-- give_back's bound. Both schedules move, so the next generation keeps the correction
-- (settle.lua, and release.lua for a batch's settles). Changes st.w; the caller stores it.
local function settle_cost(heads_key, cfg, st, delta, seq)
  if delta > 0 then
    for i, win in ipairs(cfg.windows) do
      if win.cost then
        local w = st.w[i]
        w.tat = math.max(w.tat, 0) + delta * win.interval
        w.granted = math.max(w.granted, 0) + delta * win.interval
      end
    end
  elseif delta < 0 then
    give_back(heads_key, cfg, st, seq, -delta, true)
  end
end
