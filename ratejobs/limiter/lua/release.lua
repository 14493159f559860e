--[[
release.lua: give back in-flight leases once their requests have finished: one (release) or a
whole batch's (release_many) in one call; with them, settle the cost of those whose real cost
is now known (settle.lua's correction, for many grants in the same round trip).

KEYS[1] config hash
KEYS[2] leases sorted set
KEYS[3] released list, woken callers BLPOP it
KEYS[4] state hash (only with settles)
KEYS[5] headroom history of the cost windows (only with settles)
ARGV[1] settles: "delta:cost_seq,..." one per grant to correct (settle.lua's ARGV[1] and
        ARGV[2]), "" for none
ARGV[2..n] lease ids (none is allowed with settles)

Returns {released, in_flight}: released counts the leases that were still held (a lease that
had already expired or been released counts 0; for one lease id it is 1 or 0); in_flight counts
the unexpired leases left. Each freed lease wakes one caller waiting for capacity. Without a
config hash nothing is settled: a limiter whose state was lost has nothing to correct.
]]

local now = now_us()
-- expired leases go first, so that one of them released late counts 0, as said above
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', as_string(now))
local released = 0
if #ARGV > 1 then
  released = redis.call('ZREM', KEYS[2], unpack(ARGV, 2))
end
local cfg = load_config(KEYS[1])
if cfg then
  wake_waiters(cfg, KEYS[3], released)
  if ARGV[1] ~= '' then
    local st = load_state(KEYS[4], now)
    load_windows(KEYS[4], cfg, st, now)
    local settles = {}
    for delta, seq in string.gmatch(ARGV[1], '(-?%d+):(-?%d+)') do
      settles[#settles + 1] = {delta = tonumber(delta), seq = tonumber(seq)}
    end
    settle_costs(KEYS[5], cfg, st, settles)
    store_windows(KEYS[4], st, now)
    renew_bucket({KEYS[1], KEYS[4]}, cfg, st, now, 0, KEYS[5])
  end
end
return {released, redis.call('ZCOUNT', KEYS[2], '(' .. as_string(now), '+inf')}
