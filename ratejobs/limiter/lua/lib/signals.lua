--[[
lib/signals.lua: what a block or a throttle reported by a caller does to the state (the work of
feedback.lua and feedback_many.lua).
]]

-- What one signal changes: block everyone for `block` µs and/or, for a throttle (a 429) about a
-- grant of the current generation (or of none), accept it and, when adaptive, cut the rate. A
-- throttle about an older generation's grant belongs to a burst already counted, which is how a
-- burst of 429s cuts the rate only once; one about the learning's base interval's grants counts
-- as late. Returns whether it is accepted, the rate before it and the fields it changes (the
-- learning's, and the new generation, are the caller's).
local function signal_changes(cfg, st, now, generation, block, throttled)
  local rate_before = current_rate(cfg, st, now)
  local changes = {}
  if block > 0 and now + block > st.blocked_until then
    changes.blocked_until = now + block
  end
  if not throttled then
    return false, rate_before, changes
  end
  if generation < 0 or generation == st.generation then
    if cfg.adaptive then
      -- CUBIC's fast convergence: throttled below the last peak means the real limit is lower
      -- than that peak, so the climb heads for a point between the two and flattens out sooner.
      if st.wmax and rate_before < st.wmax then
        changes.wmax = rate_before * (1 + cfg.decrease_factor) / 2
      else
        changes.wmax = rate_before
      end
      changes.wstart = rate_before * cfg.decrease_factor
      changes.decreased_at = now
    end
    return true, rate_before, changes
  end
  if cfg.adaptive and cfg.learn and generation == st.learn_base_gen then
    changes.learn_base_late = st.learn_base_late + 1
  end
  return false, rate_before, changes
end

-- What feedback.lua and feedback_many.lua do with one signal (signal_changes), counted, with the
-- learning and a new generation for an accepted throttle. Returns accepted (1 or 0) and the rate
-- before the signal.
local function apply_feedback(keys, cfg, st, now, generation, block, throttled)
  if block > 0 then
    count(keys[2], 'blocks')
  end
  if throttled then
    count(keys[2], 'throttles')
  end
  local accepted, rate_before, changes = signal_changes(cfg, st, now, generation, block,
    throttled)
  store_changes(keys[2], st, changes)
  if not accepted then
    return 0, rate_before
  end
  if cfg.adaptive then
    if cfg.learn then
      learn_from_throttle(keys[2], cfg, st, now, rate_before)
    end
    count(keys[2], 'decreases')
    st.cut_from = st.cut_from or rate_before
  end
  new_generation(keys[2], st, now)
  return 1, rate_before
end
