--[[
release.lua: give back an in-flight lease once its request has finished.

KEYS[1] config hash
KEYS[2] leases sorted set
KEYS[3] released list, woken callers BLPOP it
ARGV[1] lease id

Returns {released, in_flight}: released is 1 when the lease was still held, 0 when it had
already expired or been released; in_flight counts the unexpired leases left.
]]

local now = now_us()
local released = redis.call('ZREM', KEYS[2], ARGV[1])
local cfg = load_config(KEYS[1])
if released == 1 and cfg and cfg.max_concurrency > 0 then
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('LTRIM', KEYS[3], 0, cfg.max_concurrency - 1)
end
return {released, redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')}
