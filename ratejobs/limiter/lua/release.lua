--[[
release.lua: give back in-flight leases once their requests have finished: one (release) or a
whole batch's (release_many) in one call.

KEYS[1] config hash
KEYS[2] leases sorted set
KEYS[3] released list, woken callers BLPOP it
ARGV[1..n] lease ids, n >= 1

Returns {released, in_flight}: released counts the leases that were still held (a lease that
had already expired or been released counts 0; for one lease id it is 1 or 0); in_flight counts
the unexpired leases left. Each freed lease wakes one caller waiting for capacity.
]]

local now = now_us()
-- expired leases go first, so that one of them released late counts 0, as said above
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', as_string(now))
local released = redis.call('ZREM', KEYS[2], unpack(ARGV))
local cfg = load_config(KEYS[1])
if cfg then
  wake_waiters(cfg, KEYS[3], released)
end
return {released, redis.call('ZCOUNT', KEYS[2], '(' .. as_string(now), '+inf')}
