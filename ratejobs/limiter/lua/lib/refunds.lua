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

-- A window's schedules (offsets from now) moved back by `shift` µs, never from the future into
-- the past beyond now: the reserved one always, the granted one when the units were granted.
local function shifted_window(w, shift, granted)
  local moved = {tat = math.max(w.tat - shift, math.min(w.tat, 0)), granted = w.granted}
  if granted then
    moved.granted = math.max(w.granted - shift, math.min(w.granted, 0))
  end
  return moved
end

-- ZREM or ZADD with many arguments, in chunks: Lua's unpack stops at a few thousand values.
local UNPACK_CHUNK = 1000

local function call_chunked(command, key, args)
  for first = 1, #args, UNPACK_CHUNK do
    redis.call(command, key, unpack(args, first, math.min(first + UNPACK_CHUNK - 1, #args)))
  end
end

-- Give back units of each cost window taken by reservations, `refunds` a list of {seq = the
-- reservation's number, units = how many, granted = true for a granted call (a refund), false
-- for a reservation that went stale and will never be sent}. Each is capped by the least
-- headroom of the reservations made since it (none when the history no longer holds its own
-- entry), and what is given back is used up from those headrooms, so two refunds never give
-- back more than one could. The units come off the schedules that counted them: a granted
-- call's are in both the reserved and the granted schedule, a stale reservation's only in the
-- reserved one, or the next generation, restarting from the granted schedule, would give them
-- back a second time. Changes st.w; the caller stores it.
--
-- Refunds are given back one after the other from the newest reservation to the oldest, as if
-- they had come in that order (any order keeps the bound), in one pass over the history: each
-- entry is read once, and the headroom each refund uses up is kept per window as a running
-- total (`given`) instead of being written into every later entry at once. An entry read when
-- the total was g has been used up by what was given since: total now - g. Only the entries
-- used up are written, once, at the end. Written into every later entry refund by refund, a
-- batch would cost its size times the history's length (4,096): a recorder's batch of 1,000
-- settles would run past Redis's 5 s script limit, and stop every client of that Redis.
local function give_back(heads_key, cfg, st, refunds)
  local todo = {}
  for _, refund in ipairs(refunds) do
    if refund.seq >= 0 and refund.units > 0 then
      todo[#todo + 1] = refund
    end
  end
  if #todo == 0 then
    return
  end
  local oldest = redis.call('ZRANGE', heads_key, 0, 0, 'WITHSCORES')
  if #oldest == 0 then
    return
  end
  table.sort(todo, function(a, b) return a.seq > b.seq end)
  local first = tonumber(oldest[2])
  while #todo > 0 and todo[#todo].seq < first do
    todo[#todo] = nil
  end
  if #todo == 0 then
    return
  end
  local later = redis.call('ZRANGEBYSCORE', heads_key, '(' .. as_string(todo[#todo].seq), '+inf',
    'WITHSCORES')
  local windows, rests, headrooms, seqs, read_at = {}, {}, {}, {}, {}
  local entries = #later / 2
  for e = 1, entries do
    local i, rest, headroom = string.match(later[2 * e - 1], '^(%d+):(%d+):(%d+)$')
    windows[e], rests[e], headrooms[e] = tonumber(i), rest, tonumber(headroom)
    seqs[e] = tonumber(later[2 * e])
  end
  -- by window: what was given back so far; the least headroom + what was given when read
  local given, least = {}, {}
  local unread = entries
  for _, refund in ipairs(todo) do
    while unread >= 1 and seqs[unread] > refund.seq do
      local i = windows[unread]
      read_at[unread] = given[i] or 0
      least[i] = math.min(least[i] or math.huge, headrooms[unread] + read_at[unread])
      unread = unread - 1
    end
    for i, win in ipairs(cfg.windows) do
      if win.cost then
        local spent = given[i] or 0
        local shift = math.min(refund.units * win.interval, (least[i] or math.huge) - spent)
        st.w[i] = shifted_window(st.w[i], shift, refund.granted)
        given[i] = spent + math.floor(shift)
      end
    end
  end
  local removed, added = {}, {}
  for e = unread + 1, entries do
    local used = (given[windows[e]] or 0) - read_at[e]
    if used > 0 then
      removed[#removed + 1] = later[2 * e - 1]
      added[#added + 1] = later[2 * e]
      added[#added + 1] = windows[e] .. ':' .. rests[e] .. ':' .. math.max(0, headrooms[e] - used)
    end
  end
  call_chunked('ZREM', heads_key, removed)
  call_chunked('ZADD', heads_key, added)
end

-- Correct what granted requests took from the cost windows once their real costs are known,
-- `settles` a list of {delta = real minus granted, seq = the grant's reservation}: a delta
-- above 0 moves each cost window's schedule later by it, as if granted with the rest; below 0
-- it is given back from the grant's reservation within give_back's bound. Both schedules move,
-- so the next generation keeps the correction (settle.lua for one, release.lua for a batch).
-- Changes st.w; the caller stores it.
local function settle_costs(heads_key, cfg, st, settles)
  local refunds = {}
  for _, settle in ipairs(settles) do
    if settle.delta > 0 then
      for i, win in ipairs(cfg.windows) do
        if win.cost then
          local w = st.w[i]
          w.tat = math.max(w.tat, 0) + settle.delta * win.interval
          w.granted = math.max(w.granted, 0) + settle.delta * win.interval
        end
      end
    elseif settle.delta < 0 then
      refunds[#refunds + 1] = {seq = settle.seq, units = -settle.delta, granted = true}
    end
  end
  give_back(heads_key, cfg, st, refunds)
end
