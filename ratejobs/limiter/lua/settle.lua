--[[
settle.lua: correct what a granted request took from the "cost" windows once its real cost is
known (the tokens the API says it used, against the estimate it was granted with).

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] headroom history of the cost windows (prelude's record_headroom)
ARGV[1] the difference, real cost minus granted cost, a whole number: above 0 is charged,
        below 0 given back
ARGV[2] the grant's cost_seq (acquire.lua's), -1 when unknown (nothing is given back)

A charge moves each cost window's schedule later by the units, as if they had been granted
with the rest. A refund moves it earlier by no more than the API's own count of the call at
its real cost would be behind ours now: no more than the headroom of any reservation made
since the grant (prelude's record_headroom), nothing when that history is gone, and never past
a full window. So giving back never lets more through than the burst, whatever was reserved
meanwhile. Both the reserved and the granted schedule move, so the next generation keeps the
correction.

Returns {code, now_us}: code 0 done, 4 NOT_CONFIGURED (nothing changed: a limiter whose state
was lost has nothing to correct).
]]

local cfg = load_config(KEYS[1])
if not cfg then
  return {4, 0}
end
local delta = tonumber(ARGV[1])
local seq = tonumber(ARGV[2])
local now = now_us()
local st = load_state(KEYS[2], now)
load_windows(KEYS[2], cfg, st, now)

-- The least headroom of each cost window's reservations since the grant; 0 when the history
-- no longer reaches back to it.
local least = {}
local later = {}
if delta < 0 then
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local kept = seq >= 0 and (#oldest == 0 or tonumber(oldest[2]) <= seq + 1)
  for i = 1, #cfg.windows do
    least[i] = kept and math.huge or 0
  end
  if kept then
    later = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. seq, '+inf', 'WITHSCORES')
    for k = 1, #later, 2 do
      local i, headroom = string.match(later[k], '^(%d+):%d+:(%d+)$')
      i = tonumber(i)
      if least[i] then
        least[i] = math.min(least[i], tonumber(headroom))
      end
    end
  end
end

local given_back = {}
for i, win in ipairs(cfg.windows) do
  if win.cost then
    local w = st.w[i]
    local shift = delta * win.interval
    if shift > 0 then
      w.tat = math.max(w.tat, 0) + shift
      w.granted = math.max(w.granted, 0) + shift
    else
      shift = math.max(shift, -least[i])
      given_back[i] = math.floor(-shift)
      w.tat = math.max(w.tat + shift, math.min(w.tat, 0))
      w.granted = math.max(w.granted + shift, math.min(w.granted, 0))
    end
  end
end

-- What was given back is used up from the headroom of every later reservation, so that two
-- refunds together never give back more than one could.
for k = 1, #later, 2 do
  local i, rest, headroom = string.match(later[k], '^(%d+):(%d+):(%d+)$')
  local used = given_back[tonumber(i)] or 0
  if used > 0 then
    redis.call('ZREM', KEYS[3], later[k])
    redis.call('ZADD', KEYS[3], later[k + 1],
      i .. ':' .. rest .. ':' .. math.max(0, tonumber(headroom) - used))
  end
end
store_windows(KEYS[2], st, now)
return {0, now}
