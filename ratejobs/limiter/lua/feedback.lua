--[[
feedback.lua: what the API said about a request: block everyone for a while (Retry-After, or a
quota the headers say is used up) and/or signal throttling (a 429), which cuts the adaptive rate.

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] rate history sorted set (lib/history.lua): an accepted cut is sampled
ARGV[1] generation of the grant the signal is about, -1 when it is about no grant
ARGV[2] block duration in µs, 0 for none
ARGV[3] 1 when the API throttled the request (a 429), else 0
ARGV[4] rate history: µs between samples taken at grants (acquire.lua's ARGV[10]; a cut is
        sampled whatever the spacing); absent: nothing is sampled
ARGV[5] rate history: samples kept (the newest); absent: nothing is sampled

Returns {code, accepted, generation, blocked_until_us, now_us, rate_before, rate_after}
  code 0 done, 4 NOT_CONFIGURED (nothing changed)
  accepted 1 when this throttle was the first of its burst: it started a new generation and,
  when adaptive, cut the rate. A throttle for a grant of an older generation is ignored, so the
  many 429s of one burst count as one decrease. Rates are strings (requests per period).
Counts blocks, throttles and adaptive decreases in the state hash (lib/state.lua's COUNTERS).
The work is lib/signals.lua's apply_feedback, shared with feedback_many.lua. With learning (the
config's learn), an accepted throttle is also a measurement of the API's real limit: the grants
it accepted since sending resumed after the previous accepted throttle (lib/adaptive.lua,
"Learning the real limit"); the rate after it holds just under the learned limit instead of
CUBIC's cut.
]]

local cfg = load_config(KEYS[1])
if not cfg then
  return {4, 0, 0, 0, 0, '', ''}
end
local now = now_us()
local st = load_state(KEYS[2], now)
use_history(st, KEYS[3], ARGV[4], ARGV[5])
local accepted, rate_before = apply_feedback(KEYS, cfg, st, now, tonumber(ARGV[1]),
  tonumber(ARGV[2]), ARGV[3] == '1')
sample_cut(KEYS[2], cfg, st, now)
renew_bucket({KEYS[1], KEYS[2]}, cfg, st, now, 0)
return {0, accepted, st.generation, st.blocked_until, now, as_string(rate_before),
  as_string(current_rate(cfg, st, now))}
