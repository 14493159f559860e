--[[
lib/adaptive.lua: the adaptive rate (CUBIC, and learning the real limit) as functions of the
config and the state, and how an accepted throttle updates what was learned.
]]

-- Learning the real limit (adaptive with cfg.learn, the default). Against an API that enforces
-- less than it advertises, CUBIC saws around the real limit (cut to 0.7, climb back, overshoot:
-- about 0.85 of it on average). Learning measures the limit at each accepted throttle instead and
-- holds just under it.
--
-- The measurement: sending resumes after a throttle's block with the server's bucket full
-- again; from then (learn_from) to the next accepted throttle the server accepted every grant
-- but the throttled one. A GCRA server of real rate R and burst b accepts b + R * span while we
-- push above R, so two such intervals give R as the slope (grants - base grants) /
-- (span - base span), the base being the shortest interval seen (mostly the server's burst).
-- That holds when the interval started above R (the slope comes out at or below the rate
-- sending resumed at). When it started below R and climbed past it, the throttle came once the
-- climb's excess over R used up the burst b (estimated from the base): R = rate_before -
-- sqrt(2 * b * slope of the climb). An interval in which the workers sent less than LEARN_BUSY
-- of what the rate allowed (idle, or held back by something else) says nothing about the server
-- and is skipped.
--
-- Each phase of the learning rate starts at learn_target from learn_from: when sending first
-- starts (the API's bucket is full then, as after a block, so the span to the first throttle is
-- already a measurement), after each accepted throttle's block, and after an idle spell (from
-- the rate it stood at, never above where a learned limit is held: learning_idle_cap). After
-- an accepted throttle learn_target is:
--   nothing learned yet: decrease_factor times the rate before, climbing by LEARN_CLIMB times
--     it per recovery_seconds (discovery, like CUBIC's cuts);
--   a rough estimate (fewer than LEARN_PRECISE_GRANTS grants between the two intervals, and
--     nothing sure learned before): the estimate, climbing by LEARN_ROUGH_CLIMB, so that the
--     next throttle measures over a longer span; once sure, a rough measurement at or above
--     decrease_factor of the rate corrects the estimate and keeps it sure;
--   learned: LEARN_HOLD times it, creeping up by LEARN_PROBE * (t / recovery_seconds)^3, so a
--     raised limit is found while a steady one is crossed only after about two recovery periods
--     (a throttle reached so, below the rate it came at, keeps the learned limit unless the
--     estimate is higher).
-- A throttle never raises the rate; decrease_factor's cut and the one-decrease-per-burst rule
-- (generations) apply as with CUBIC; CUBIC's fields are kept up to date too, so turning learn off
-- falls back to CUBIC from the last cut.
-- The arithmetic is in functions of values (learning_*, current_rate, after_throttle) that return
-- the fields they change; start_learning_phase and learn_from_throttle read and write Redis.
-- Measured limits are within 1-2 % of the real one (bench/adaptive.py); holding 2 % under it
-- leaves no 429s until the probe crosses it.
local LEARN_HOLD = 0.99
-- While finding the limit the rate climbs by twice where it started per recovery period (10 %/s
-- at the default 20 s): a limit 20-30 % above is met within a few seconds, and the overshoot
-- the estimate subtracts (sqrt(2 * b * slope)) stays a few per cent.
local LEARN_CLIMB = 2.0
-- From a rough estimate (off by a few per cent: a grant or two in twenty) the climb is a quarter
-- of that (2.5 %/s): an estimate 10 % low is passed in 4 s, while one about right is crossed
-- gently, so the next throttle comes over fifty grants or more later and makes it sure, instead
-- of a quick overshoot that measures again over too few.
local LEARN_ROUGH_CLIMB = 0.5
-- A steady limit held at LEARN_HOLD is crossed after (0.01 / LEARN_PROBE)^(1/3) ~ 1.7 recovery
-- periods: one throttle (and its block, a second or more) every ~35 s at the default 20 s.
local LEARN_PROBE = 0.002
-- Grants the slope is measured over before it counts as learned: a count is off by one or two
-- (429s in flight), 2-4 % of 50.
local LEARN_PRECISE_GRANTS = 50
-- Intervals closer in length than this give a slope of mostly counting noise.
local LEARN_MIN_SPAN_US = 100000
-- An interval counts when the workers took at least this share of the grants the rate allowed:
-- they kept pushing, so the server's answers measure the server, not an idle job.
local LEARN_BUSY = 0.9

-- The instant the learning rate is read at: `now` while sending, else when the API became idle
-- (nothing granted for a whole period). Probing upward with nothing sent measures nothing, and
-- a rate that climbed to the ceiling through an idle spell would start the next job with a 429.
local function learning_now(cfg, st, now)
  return now + math.min(0, st.granted_tat + cfg.period * 1000000)
end

-- The climb per recovery period from learn_target before anything is sure: discovery's, or the
-- gentler one from a rough estimate.
local function learning_climb(st)
  return st.learned and LEARN_ROUGH_CLIMB or LEARN_CLIMB
end

-- Where an idle API's rate stands at most once a limit was learned: where it holds while busy.
-- The probe above it (or a trickle's climb towards the ceiling) measured nothing, and the
-- API's bucket refills while idle, so the next job would start above the limit, into a 429.
local function learning_idle_cap(st)
  return st.learn_sure and st.learned * LEARN_HOLD or st.learned
end

-- The learning rate t µs after learn_from, and its slope (requests per period, per period).
local function learning_rate(cfg, st, now)
  local at = learning_now(cfg, st, now)
  local t = math.max(0, at - st.learn_from) / (cfg.recovery_seconds * 1000000)
  local r
  if st.learn_sure then
    r = st.learn_target * (1 + LEARN_PROBE * t * t * t)
  else
    r = st.learn_target * (1 + learning_climb(st) * t)
  end
  if at < now and st.learned then
    r = math.min(r, learning_idle_cap(st))
  end
  return r
end

local function learning_slope(cfg, st, now)
  now = learning_now(cfg, st, now)
  local t = math.max(0, now - st.learn_from) / (cfg.recovery_seconds * 1000000)
  local per_period = cfg.period / cfg.recovery_seconds
  if st.learn_sure then
    return st.learn_target * 3 * LEARN_PROBE * t * t * per_period
  end
  return st.learn_target * learning_climb(st) * per_period
end

-- Grants the learning rate allowed in the `span` µs after learn_from (its integral).
local function learning_allowance(cfg, st, span)
  local k = cfg.recovery_seconds
  local t = span / 1000000
  local units
  if st.learn_sure then
    units = t + LEARN_PROBE * t * t * t * t / (4 * k * k * k)
  else
    units = t + learning_climb(st) * t * t / (2 * k)
  end
  return math.min(st.learn_target * units, cfg.rate * t) / cfg.period
end

-- The adaptive rate: learning's (above) when it has started, else CUBIC (as AWS's adaptive
-- retry mode): right after a decrease it is wstart (decrease_factor times the rate before), it
-- climbs back to wmax in recovery_seconds, then probes above it. Always within [min_rate, rate].
local function current_rate(cfg, st, now)
  if not cfg.adaptive then
    return cfg.rate
  end
  local r
  if cfg.learn and st.learn_target and st.learn_from then
    r = learning_rate(cfg, st, now)
  elseif st.wmax and st.decreased_at then
    local k = cfg.recovery_seconds
    local scale = (st.wmax - (st.wstart or st.wmax * cfg.decrease_factor)) / (k * k * k)
    local d = (now - st.decreased_at) / 1000000 - k
    r = st.wmax + scale * d * d * d
  else
    return cfg.rate
  end
  return math.max(cfg.min_rate, math.min(cfg.rate, r))
end

-- Whether an acquire at `now` starts a learning phase: the first one a state sees (sending
-- starts with the API's bucket full), or the first after an idle spell (it refilled meanwhile).
-- Either way the span from here to the next throttle measures the API as after_throttle
-- expects, and the probe's clock counts time spent sending, not time idle.
local function learning_phase_due(cfg, st, now)
  if not (cfg.adaptive and cfg.learn) then
    return false
  end
  if not st.learn_from then
    return true
  end
  return st.learn_target ~= nil and now > st.learn_from and learning_now(cfg, st, now) < now
end

-- The fields of a learning phase starting at `now`, from the rate it stands at (n_grants is
-- `grants`).
local function learning_phase(cfg, st, now, grants)
  return {learn_target = current_rate(cfg, st, now), learn_from = now, learn_grants = grants}
end

-- An accepted throttle at `now` as a measurement of the real limit (see "Learning the real
-- limit" above), with n_grants `grants` and the rate `rate_before` it came at: the fields it
-- changes (the estimate, the base interval, and the next phase from when sending resumes).
local function after_throttle(cfg, st, now, rate_before, grants)
  local changes = {}
  local learned, sure = st.learned, st.learn_sure
  local span = now - (st.learn_from or now)
  if st.learn_target and span > 0 then
    local accepted = grants - st.learn_grants - 1
    if accepted >= LEARN_BUSY * learning_allowance(cfg, st, span) then
      local period_us = cfg.period * 1000000
      local base_us, base = st.learn_base_us, st.learn_base_grants
      if base_us and span - base_us >= LEARN_MIN_SPAN_US and accepted > base then
        local slope = (accepted - base) * period_us / (span - base_us)
        local resumed_at = math.max(cfg.min_rate, math.min(cfg.rate, st.learn_target))
        if slope <= resumed_at then
          -- One measurement cuts no deeper than CUBIC would: a 429 for another reason (another
          -- limit, an outage) makes a line of any slope, and the climb finds the limit again.
          -- A throttle while holding a sure estimate corrects it (down) rather than starting
          -- the search again: a measurement over too few grants to be precise still keeps it
          -- sure, or the climb that follows overshoots and throttles every few seconds.
          local floor = rate_before * cfg.decrease_factor
          learned = math.max(slope, floor)
          sure = slope >= floor and (sure or accepted - base >= LEARN_PRECISE_GRANTS)
        else
          -- the base's grants sent while its throttle was in flight were 429s too
          local burst = math.max(1, base - st.learn_base_late - slope * base_us / period_us)
          local overshoot = math.sqrt(2 * burst * learning_slope(cfg, st, now))
          local estimate = math.max(resumed_at, rate_before - overshoot)
          -- A learned limit below the rate throttled at still fits (arrivals bunch up in
          -- transit, so the slow probe meets the limit a little early): keep it unless the
          -- limit rose.
          if not learned or estimate > learned or learned >= rate_before then
            learned = estimate
          end
          sure = true
        end
        learned = math.min(learned, cfg.rate)
        changes.learned = learned
      end
      if not base_us or span < base_us then
        changes.learn_base_us, changes.learn_base_grants = span, accepted
        changes.learn_base_gen, changes.learn_base_late = st.generation, 0
      end
    end
  end
  local target = rate_before * cfg.decrease_factor
  if learned and sure then
    target = learned * LEARN_HOLD
  elseif learned then
    target = learned
  end
  changes.learn_sure = sure
  changes.learn_target = math.min(target, rate_before)
  changes.learn_from = math.max(now, st.blocked_until)
  changes.learn_grants = grants
  return changes
end

local function grants_so_far(state_key)
  return tonumber(redis.call('HGET', state_key, 'n_grants')) or 0
end

-- At an acquire: start a learning phase when one is due (learning_phase_due).
local function start_learning_phase(state_key, cfg, st, now)
  if learning_phase_due(cfg, st, now) then
    store_changes(state_key, st, learning_phase(cfg, st, now, grants_so_far(state_key)))
  end
end

-- At an accepted throttle: learn from it (after_throttle).
local function learn_from_throttle(state_key, cfg, st, now, rate_before)
  store_changes(state_key, st,
    after_throttle(cfg, st, now, rate_before, grants_so_far(state_key)))
end
