--[[
lib/signals.lua: what a block or a throttle reported by a caller does to the state (the work of
feedback.lua and feedback_many.lua).
]]

-- What feedback.lua and feedback_many.lua do with one signal: block everyone for `block` µs
-- and/or, for a throttle (a 429) about a grant of the current generation (or of none), start a
-- new generation and, when adaptive, cut the rate. A throttle about an older generation's grant
-- belongs to a burst already counted, which is how a burst of 429s cuts the rate only once.
-- Returns accepted (1 or 0) and the rate before the signal.
local function apply_feedback(keys, cfg, st, now, generation, block, throttled)
  local rate_before = current_rate(cfg, st, now)
  local accepted = 0
  if block > 0 then
    count(keys[2], 'blocks')
  end
  if throttled then
    count(keys[2], 'throttles')
  end
  if block > 0 and now + block > st.blocked_until then
    st.blocked_until = now + block
    redis.call('HSET', keys[2], 'blocked_until', st.blocked_until)
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
      redis.call('HSET', keys[2], 'wmax', as_string(st.wmax), 'wstart', as_string(st.wstart),
        'decreased_at', now)
      if cfg.learn then
        learn_from_throttle(keys, cfg, st, now, rate_before)
      end
      count(keys[2], 'decreases')
      st.cut_from = st.cut_from or rate_before
    end
    new_generation(keys[2], st, now)
  elseif throttled and cfg.adaptive and cfg.learn and generation == st.learn_base_gen then
    st.learn_base_late = st.learn_base_late + 1
    redis.call('HSET', keys[2], 'learn_base_late', st.learn_base_late)
  end
  return accepted, rate_before
end
