--[[
feedback_many.lua: feedback.lua for several responses at once (a batch of requests sent
together). The signals are applied one after another in the given order, exactly as that many
feedback.lua calls would apply them (lib/signals.lua), so the 429s of one burst still
cut the adaptive rate once: the first throttle about the current generation starts a new one,
and the others, about grants of the generation before, are ignored.

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] rate history sorted set (lib/history.lua): an accepted cut is sampled
ARGV[1] rate history: µs between samples taken at grants (feedback.lua's ARGV[4])
ARGV[2] rate history: samples kept (the newest); 0 (or no KEYS[3]): nothing is sampled
ARGV[3i], ARGV[3i+1], ARGV[3i+2] for signal i (i from 1): generation of its grant (-1 for
        none), block duration in µs (0 for none), 1 when the API throttled the request (a 429)
        else 0

Returns {code, now_us, {accepted, generation, blocked_until_us, rate_before, rate_after}, ...}
  code 0 done, 4 NOT_CONFIGURED (nothing changed, no results); one result per signal, as
  feedback.lua returns them.
]]

local cfg = load_config(KEYS[1])
if not cfg then
  return {4, 0}
end
local now = now_us()
local st = load_state(KEYS[2], now)
use_history(st, KEYS[3], ARGV[1], ARGV[2])
local reply = {0, now}
for i = 3, #ARGV, 3 do
  local accepted, rate_before = apply_feedback(KEYS, cfg, st, now, tonumber(ARGV[i]),
    tonumber(ARGV[i + 1]), ARGV[i + 2] == '1')
  reply[#reply + 1] = {accepted, st.generation, st.blocked_until, as_string(rate_before),
    as_string(current_rate(cfg, st, now))}
end
sample_cut(KEYS[2], cfg, st, now)
renew_bucket({KEYS[1], KEYS[2]}, cfg, st, now, 0)
return reply
