--[[
clock.lua: Redis's clock, the one every decision of this limiter is made on. Called with the
limiter's config key so that on a cluster it runs on the node holding the limiter's keys, whose
clock is the one its scripts read.

KEYS[1] config hash (not read)

Returns now, in µs since the epoch.
]]

return now_us()
