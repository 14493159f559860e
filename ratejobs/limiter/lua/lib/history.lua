--[[
lib/history.lua: the rate history, samples of the adaptive rate for the operator's chart.
]]

-- Rate history: the adaptive rate over time, for the operator's chart (Limiter.rate_history).
-- A sorted set (the scripts' history key, scored by µs) of members
-- "<at_us>:<rate>:<period>:<grants>": the rate granted at (requests per period) and the grants
-- counter then, so two samples also give the grants between them. Grants add a sample at most
-- every `every` µs (the time of the last one is the state's sampled_at, read with the rest of
-- the state: a grant between samples costs nothing more); an accepted rate cut always adds
-- two, the rate just before it and the rate after, so the cut shows at once and as a step.
-- The set keeps the newest `kept` samples. st.history is {key, every, kept}, or nil when the
-- caller passed none (then nothing is sampled); set it with use_history.
local function use_history(st, key, every, kept)
  every, kept = tonumber(every), tonumber(kept)
  if key and every and kept and kept > 0 then
    st.history = {key = key, every = every, kept = kept}
  end
end

local function add_samples(state_key, st, now, samples)
  local args = {}
  for _, sample in ipairs(samples) do
    local at, rate, period, grants = sample[1], sample[2], sample[3], sample[4]
    args[#args + 1] = at
    -- as_string, not '..': Lua's own number format keeps 14 digits, a µs time has 16
    args[#args + 1] = as_string(at) .. ':' .. as_string(rate) .. ':' .. as_string(period) .. ':'
      .. as_string(grants)
  end
  redis.call('ZADD', st.history.key, unpack(args))
  redis.call('ZREMRANGEBYRANK', st.history.key, 0, -st.history.kept - 1)
  -- The chart shows what the kept samples span at one per `every`; an API idle that long has
  -- no history worth drawing, and the key leaves Redis.
  redis.call('PEXPIRE', st.history.key, math.ceil(st.history.kept * st.history.every / 1000))
  redis.call('HSET', state_key, 'sampled_at', now)
  st.sampled_at = now
end

-- After a grant (`grants` is the counter now): a sample when the last is `every` µs old.
local function sample_grant(state_key, cfg, st, now, grants)
  if st.history and now - st.sampled_at >= st.history.every then
    add_samples(state_key, st, now, {{now, current_rate(cfg, st, now), cfg.period, grants}})
  end
end

-- After the feedback scripts' signals, when they cut the rate (apply_feedback sets st.cut_from
-- to the rate before the first cut): the rate before and after, 1 µs apart, whatever the
-- spacing; several cuts at one instant (feedback_many) make one step.
local function sample_cut(state_key, cfg, st, now)
  if st.history and st.cut_from then
    local grants = tonumber(redis.call('HGET', state_key, 'n_grants')) or 0
    add_samples(state_key, st, now, {{now - 1, st.cut_from, cfg.period, grants},
      {now, current_rate(cfg, st, now), cfg.period, grants}})
  end
end
