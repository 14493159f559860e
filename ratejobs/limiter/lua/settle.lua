--[[
settle.lua: correct what a granted request took from the "cost" windows once its real cost is
known (the tokens the API says it used, against the estimate it was granted with).

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] headroom history of the cost windows (lib/refunds.lua's record_headroom)
ARGV[1] the difference, real cost minus granted cost, a whole number: above 0 is charged,
        below 0 given back
ARGV[2] the grant's cost_seq (acquire.lua's), -1 when unknown (nothing is given back)

A charge moves each cost window's schedule later by the units, as if they had been granted
with the rest. A refund moves it earlier by no more than the API's own count of the call at
its real cost would be behind ours now: no more than the headroom of any reservation made
since the grant (lib/refunds.lua), nothing when that history is gone, and never past
a full window. So giving back never lets more through than the burst, whatever was reserved
meanwhile. Both the reserved and the granted schedule move, so the next generation keeps the
correction. release.lua does the same for a batch, with its leases' return.

Returns {code, now_us}: code 0 done, 4 NOT_CONFIGURED (nothing changed: a limiter whose state
was lost has nothing to correct).
]]

local cfg = load_config(KEYS[1])
if not cfg then
  return {4, 0}
end
local now = now_us()
local st = load_state(KEYS[2], now)
load_windows(KEYS[2], cfg, st, now)
settle_costs(KEYS[3], cfg, st, {{delta = tonumber(ARGV[1]), seq = tonumber(ARGV[2])}})
store_windows(KEYS[2], st, now)
renew_bucket({KEYS[1], KEYS[2]}, cfg, st, now, 0, KEYS[3])
return {0, now}
