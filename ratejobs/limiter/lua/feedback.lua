--[[
feedback.lua: what the API said about a request: block everyone for a while (Retry-After, or a
quota the headers say is used up) and/or signal throttling (a 429), which cuts the adaptive rate.

KEYS[1] config hash
KEYS[2] state hash
ARGV[1] generation of the grant the signal is about, -1 when it is about no grant
ARGV[2] block duration in µs, 0 for none
ARGV[3] 1 when the API throttled the request (a 429), else 0

Returns {code, accepted, generation, blocked_until_us, now_us, rate_before, rate_after}
  code 0 done, 4 NOT_CONFIGURED (nothing changed)
  accepted 1 when this throttle was the first of its burst: it started a new generation and,
  when adaptive, cut the rate. A throttle for a grant of an older generation is ignored, so the
  many 429s of one burst count as one decrease. Rates are strings (requests per period).
Counts blocks, throttles and adaptive decreases in the state hash (prelude's COUNTERS).
]]

local cfg = load_config(KEYS[1])
if not cfg then
  return {4, 0, 0, 0, 0, '', ''}
end
local generation = tonumber(ARGV[1])
local block = tonumber(ARGV[2])
local throttled = ARGV[3] == '1'
local now = now_us()
local st = load_state(KEYS[2], now)
local rate_before = current_rate(cfg, st, now)
local accepted = 0

if block > 0 then
  count(KEYS[2], 'blocks')
end
if throttled then
  count(KEYS[2], 'throttles')
end
if block > 0 and now + block > st.blocked_until then
  st.blocked_until = now + block
  redis.call('HSET', KEYS[2], 'blocked_until', st.blocked_until)
end
if throttled and (generation < 0 or generation == st.generation) then
  accepted = 1
  if cfg.adaptive then
    -- CUBIC's fast convergence: throttled below the last peak means the real limit is lower
    -- than that peak, so the climb heads for a point between the two and flattens out sooner.
    if st.wmax and rate_before < st.wmax then
      st.wmax = rate_before * (1 + cfg.decrease_factor) / 2
    else
      st.wmax = rate_before
    end
    st.wstart = rate_before * cfg.decrease_factor
    st.decreased_at = now
    redis.call('HSET', KEYS[2], 'wmax', as_string(st.wmax), 'wstart', as_string(st.wstart),
      'decreased_at', now)
    count(KEYS[2], 'decreases')
  end
  new_generation(KEYS[2], st, now)
end
return {0, accepted, st.generation, st.blocked_until, now, as_string(rate_before),
  as_string(current_rate(cfg, st, now))}
