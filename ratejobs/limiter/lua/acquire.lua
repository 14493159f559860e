--[[
acquire.lua: take an in-flight lease and reserve the next send slot, or confirm a reservation
right before sending.

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] leases sorted set (lease id -> expiry, µs)
KEYS[4] released list (one token per freed lease; callers waiting for capacity BLPOP it)
KEYS[5] headroom history of the cost windows (lib/refunds.lua's record_headroom), for settle.lua
KEYS[6] rate history sorted set (lib/history.lua), sampled as grants are made
ARGV[1] weight: units this call costs, 1 <= weight <= burst
ARGV[2] lease id, a random token chosen by the caller
ARGV[3] lease time-to-live in µs; a lease expires this long after its slot, so a killed
        worker never leaks capacity
ARGV[4] longest acceptable wait in µs, -1 for no limit
ARGV[5] slot of the reservation being confirmed in µs, -1 when asking anew
ARGV[6] generation of that reservation, -1 when asking anew
ARGV[7] the caller's config version (configure.lua's ARGV[9]), 0 when unversioned
ARGV[8] cost: units this call takes from each "cost" window (tokens), >= 0; absent means 0
ARGV[9] cost_seq of the reservation being confirmed (its reply's), -1 when asking anew: a
        reservation that no longer holds (a block, a holder a slot late) gives its cost back
        to the cost windows before a new one is made (lib/refunds.lua's give_back)
ARGV[10] rate history: µs between samples taken at grants; absent: nothing is sampled
ARGV[11] rate history: samples kept (the newest); absent: nothing is sampled
ARGV[12] 1: keep the place: a slot further away than ARGV[4] is reserved all the same (WAIT)
        when it is within lib/schedule.lua's keeps_place bound, for a caller that hands the
        reservation on and confirms it when its slot comes; absent or 0: TOO_LONG as ever
ARGV[13] 1: with a grant, also reserve the caller's next slot (a spare, lib/schedule.lua's
        reserve_spare), which it confirms like any reservation when it asks again; absent
        or 0: none

Returns {code, wait_us, slot_us, generation, now_us, cost_seq, leased, spare_slot_us, late_us}
  0 GRANTED         send at slot_us, the granted slot: now (slot_us <= now_us), or, for a
                    slot up to lib/schedule.lua's CONFIRM_AHEAD_US away (a reservation confirmed
                    early, or a new one that near), after sleeping wait_us
  1 WAIT            a slot is reserved at slot_us; sleep wait_us, then call again passing slot
                    and generation to confirm it right before sending (blocks and rate cuts
                    that came meanwhile are checked then; a holder more than one slot late
                    gets a new reservation)
                    (with ARGV[12], wait_us may exceed ARGV[4]: the place is kept)
  2 TOO_LONG        the earliest slot is wait_us away, more than ARGV[4] (and, with ARGV[12],
                    beyond the place it may keep); nothing is held
  3 AT_CAPACITY     max_concurrency leases are out; the earliest expires in wait_us
  4 NOT_CONFIGURED  there is no config hash, or it is older than the caller's version; nothing
                    changed
  cost_seq is the new reservation's number in the cost windows' history (pass it to
  settle.lua), -1 when no reservation was made now or the request takes nothing from them
  leased is 1 when the slot holds a lease to give back (release.lua), 0 without an in-flight
  cap; spare_slot_us is the spare's slot under the same generation, -1 when none was made
  late_us is how far past its slot a request may still leave: the slot's length (weight times
  the interval, whole µs), as a holder a whole slot late queues again (reservation_holds); the
  caller checks it once more right before it sends (core.Grant.stale_at), 0 when not configured
Counts grants, new reservations (waits, with their wait), TOO_LONG and AT_CAPACITY answers in
the state hash (lib/state.lua's COUNTERS); a grant samples the rate history when its last
sample is ARGV[10] old.
]]

local cfg = load_config(KEYS[1])
if not cfg or config_outdated(cfg, ARGV[7]) then
  return {4, 0, 0, 0, 0, -1, 0, -1, 0}
end
local weight = tonumber(ARGV[1])
local cost = tonumber(ARGV[8]) or 0
local refused = too_big(cfg, weight, cost)
if refused then
  return redis.error_reply(refused)
end
local lease_id = ARGV[2]
local ttl = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local held_slot = tonumber(ARGV[5])
local held_generation = tonumber(ARGV[6])
local now = now_us()
local st = load_state(KEYS[2], now)
use_history(st, KEYS[6], ARGV[10], ARGV[11])
load_windows(KEYS[2], cfg, st, now)
start_learning_phase(KEYS[2], cfg, st, now)
local interval = interval_us(cfg, current_rate(cfg, st, now))
local late = math.floor(weight * interval)
local leased = takes_lease(cfg) and 1 or 0
-- the keys this call may write; without a cap it takes no lease
local bucket = leased == 1 and {KEYS[1], KEYS[2], KEYS[3]} or {KEYS[1], KEYS[2]}
local spare_wanted = ARGV[13] == '1'

if reservation_holds(st, now, held_slot, held_generation, weight, interval) then
  if now >= held_slot - CONFIRM_AHEAD_US then
    grant_slot(KEYS, cfg, st, now, lease_id, ttl, held_slot, weight, interval, cost)
    local spare = reserve_spare(KEYS, cfg, st, now, spare_wanted, weight, interval)
    store_times(KEYS[2], now, st, spare >= 0 and {'granted_tat', 'tat'} or {'granted_tat'})
    store_windows(KEYS[2], st, now)
    renew_bucket(bucket, cfg, st, now, leased * (now + ttl), KEYS[5])
    return {0, math.max(0, held_slot - now), held_slot, st.generation, now, -1, leased, spare,
      late}
  end
  return {1, held_slot - now, held_slot, st.generation, now, -1, leased, -1, late}
end
if held_slot >= 0 and held_generation == st.generation then
  give_back(KEYS[5], cfg, st, {{seq = tonumber(ARGV[9]) or -1, units = cost, granted = false}})
  store_windows(KEYS[2], st, now)
end

local wait = next_slot_offset(cfg, st, now, weight, interval, cost)
local slot = now + wait
if max_wait >= 0 and wait > max_wait
    and not keeps_place(cfg, ARGV[12] == '1', weight, cost, interval, wait, max_wait) then
  wake_waiters(cfg, KEYS[4], redis.call('ZREM', KEYS[3], lease_id))
  count(KEYS[2], 'too_long')
  renew_bucket(bucket, cfg, st, now, 0, KEYS[5])
  return {2, wait, slot, st.generation, now, -1, leased, -1, late}
end

if leased == 1 and not redis.call('ZSCORE', KEYS[3], lease_id)
    and free_leases(cfg, KEYS[3], now) <= 0 then
  count(KEYS[2], 'at_capacity')
  renew_bucket(bucket, cfg, st, now, 0, KEYS[5])
  return {3, first_expiry_in(KEYS[3], now), 0, st.generation, now, -1, leased, -1, late}
end

local seq_before = st.cost_seq
reserve_slot(KEYS, cfg, st, now, lease_id, ttl, wait, weight, interval, cost)
local seq = st.cost_seq ~= seq_before and st.cost_seq or -1
local spare = -1
local granted = wait <= CONFIRM_AHEAD_US
if granted then
  if wait > 0 then
    -- as near as a reservation may be confirmed ahead: confirmed at once, which saves its
    -- holder the round trip; it sleeps the rest itself
    grant_slot(KEYS, cfg, st, now, lease_id, ttl, slot, weight, interval, cost)
  end
  spare = reserve_spare(KEYS, cfg, st, now, spare_wanted, weight, interval)
end
store_times(KEYS[2], now, st, granted and {'tat', 'granted_tat'} or {'tat'})
store_windows(KEYS[2], st, now)
renew_bucket(bucket, cfg, st, now, leased * (slot + ttl), KEYS[5])
if granted then
  return {0, wait, slot, st.generation, now, seq, leased, spare, late}
end
return {1, wait, slot, st.generation, now, seq, leased, -1, late}
