--[[
lib/lifetimes.lua: the expiry of every key of a bucket, renewed on use, and the refund
history bounded in time.
]]

-- Lifetimes: every key of a bucket expires once nothing in it can matter any more, so the
-- bucket of a key nobody uses leaves Redis. Its next use finds no config (NOT_CONFIGURED), the
-- caller writes its limits (the database's), and the bucket starts full: what the forgotten
-- state would have said by then, since the expiry is no earlier than
--   every window's span: a grant is remembered for the window's period, or for the time its
--     burst takes to refill when that is longer, so no spent quota is handed back;
--   the schedules' ends (reservations far ahead, a charge settled later);
--   the end of every lease (a reservation's runs from its slot), of a block, and of the
--     adaptive rate's climb back to its ceiling after a cut.
-- The scripts that do not see every lease (feedback, settle, configure) never shorten what the
-- acquire scripts set, so an expiry is the latest any script computed; each is bounded by the
-- limits, the longest lease asked for and the longest block.
-- The margin: Redis never expires a key early on its own clock, the scripts' clock; it covers
-- rounding to ms and a replica's clock a little behind after a failover.
local LIFETIME_MARGIN_US = 1000000
-- A learned limit is a fact about the API, not about its last burst: it is kept through idle
-- spells (the rate stands still meanwhile: learning_phase_due) for this long after the bucket's
-- last use, so tomorrow's job starts at the held rate rather than at the ceiling, into a 429.
-- So is a rate still climbing towards a limit being learned (learn_target): idle, it stands
-- still too, and would never reach the time rate_recovered_at computes for it.
local LEARNED_KEPT_US = 24 * 3600 * 1000000

local function window_span_us(rate, period, burst)
  return math.max(period, burst * period / rate) * 1000000
end

-- When the adaptive rate is back at the ceiling for good (it only climbs between cuts): 0 when
-- it was never cut. Solves current_rate's formulas for cfg.rate.
local function rate_recovered_at(cfg, st)
  if not cfg.adaptive then
    return 0
  end
  local k = cfg.recovery_seconds
  if cfg.learn and st.learn_target and st.learn_from then
    local gap = math.max(0, cfg.rate / math.max(st.learn_target, 1e-9) - 1)
    local t = st.learn_sure and (gap / LEARN_PROBE) ^ (1 / 3) or gap / learning_climb(st)
    return st.learn_from + t * k * 1000000
  end
  if st.wmax and st.decreased_at then
    local scale = (st.wmax - (st.wstart or st.wmax * cfg.decrease_factor)) / (k * k * k)
    if scale <= 0 then
      return st.decreased_at + k * 1000000
    end
    local x = (cfg.rate - st.wmax) / scale
    local d = x >= 0 and x ^ (1 / 3) or -((-x) ^ (1 / 3))
    return st.decreased_at + (k + d) * 1000000
  end
  return 0
end

-- Refund history bounded by time: at a mark (heads_seq, heads_until in the state hash) the
-- history's newest seq and the bucket's expiry then are noted; once that expiry has passed,
-- every reservation before the mark has left every window and its lease has ended, so its
-- entries go (a refund for it gives back nothing, as when the count cap dropped it). Entries
-- live one to two lifetimes; the mark's own seq stays, so the history is never emptied.
local function trim_heads(state_key, heads_key, st, now, expires_at)
  local mark = read_fields(state_key, {'heads_seq', 'heads_until'})
  local seq, mark_until = tonumber(mark.heads_seq), tonumber(mark.heads_until)
  if mark_until and now < mark_until then
    return
  end
  if seq then
    redis.call('ZREMRANGEBYSCORE', heads_key, '-inf', '(' .. as_string(seq))
  end
  redis.call('HSET', state_key, 'heads_seq', st.cost_seq, 'heads_until', expires_at)
end

-- Renewing every key at every grant would add several Redis calls to each, so an expiry is set
-- this much past what is needed (or a quarter of the longest span, when longer), and the calls
-- within it renew only the keys they may have made again.
local RENEW_SLACK_US = 1000000

-- Renew the expiry of a bucket's keys after a script wrote to them. keys: {config, state, ...}
-- as the script was given them; config and state are always renewed together, so the state's
-- expiry is theirs. lease_end: the latest end of a lease this call took (0 for none).
-- heads_key: the refund history (renewed and bounded in time with cost windows), or nil.
local function renew_bucket(keys, cfg, st, now, lease_end, heads_key)
  local at = math.max(now + st.tat, now + st.granted_tat, st.blocked_until,
    rate_recovered_at(cfg, st), lease_end)
  if cfg.adaptive and cfg.learn and (st.learned or st.learn_target) then
    at = math.max(at, now + LEARNED_KEPT_US)
  end
  local span = window_span_us(cfg.rate, cfg.period, cfg.burst)
  local costed = false
  for i, win in ipairs(cfg.windows) do
    span = math.max(span, window_span_us(win.rate, win.period, win.burst))
    costed = costed or win.cost
    if st.w and st.w[i] then
      at = math.max(at, now + st.w[i].tat, now + st.w[i].granted)
    end
  end
  local need = math.ceil((math.max(at, now + span) + LIFETIME_MARGIN_US - now) / 1000)
  local ms = redis.call('PTTL', keys[2])
  local first = 3
  if ms < need then
    ms = need + math.ceil(math.max(RENEW_SLACK_US, span / 4) / 1000)
    first = 1
    if heads_key and costed and st.cost_seq and st.cost_seq > 0 then
      trim_heads(keys[2], heads_key, st, now, now + need * 1000)
    end
  end
  -- the others may be new since (a leases set emptied by releases and taken again)
  for i = first, #keys do
    redis.call('PEXPIRE', keys[i], ms)
  end
  if heads_key and costed then
    redis.call('PEXPIRE', heads_key, ms)
  end
end
