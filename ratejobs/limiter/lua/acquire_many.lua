--[[
acquire_many.lua: take up to `count` in-flight leases and reserve as many consecutive send
slots in one call, for a caller that runs several requests at once. Each slot is decided
exactly as `count` acquire.lua calls at the same instant would decide it (lib/schedule.lua's
next_slot_offset and reserve_slot), so the pace, burst, block and adaptive rate bind a batch as
they bind single calls; it stops early rather than wait past max_wait or exceed the cap.

KEYS[1] config hash
KEYS[2] state hash
KEYS[3] leases sorted set (lease id -> expiry, µs)
KEYS[4] released list (one token per freed lease; callers waiting for capacity BLPOP it)
KEYS[5] headroom history of the cost windows (lib/refunds.lua's record_headroom), for settle.lua
KEYS[6] rate history sorted set (lib/history.lua), sampled as grants are made
ARGV[1] weight of each request, 1 <= weight <= burst
ARGV[2] count: slots wanted, >= 1
ARGV[3] lease id prefix, a random token chosen by the caller; slot i's lease is
        prefix .. ':' .. i (i from 1)
ARGV[4] lease time-to-live in µs, from the slot, as in acquire.lua
ARGV[5] longest acceptable wait in µs, -1 for no limit: no slot further away is reserved
ARGV[6] the caller's config version (configure.lua's ARGV[9]), 0 when unversioned
ARGV[7] the costs of the slots in "cost" windows, comma-separated (slot i's is the i-th), ""
        or absent when every slot costs 0
ARGV[8] rate history: µs between samples taken at grants; absent: nothing is sampled
ARGV[9] rate history: samples kept (the newest); absent: nothing is sampled

Returns {code, hint_us, generation, now_us, cost_seqs, leased, slot_1, ..., slot_n}, n <= count,
slots ascending; cost_seqs is "seq_1,...,seq_n", each slot's number in the cost windows' history
(-1 for a slot that takes nothing from them), to pass to settle.lua; leased is 1 when the slots
hold leases to give back (release.lua), 0 without an in-flight cap
  code 0          all `count` slots reserved; hint_us is 0
       2 TOO_LONG the next slot is hint_us away, more than ARGV[5]; the n before it are held
       3 AT_CAPACITY  max_concurrency leases are out; the earliest expires in hint_us
       4 NOT_CONFIGURED  there is no config hash, or it is older than the caller's version;
                         nothing changed (n = 0)
  slot_i <= now_us: granted now (send at once); slot_i > now_us: reserved like acquire.lua's
  WAIT: sleep until it, then confirm it with acquire.lua (ARGV[5], ARGV[6] = slot_i and
  generation) right before sending, so a block or rate cut that came meanwhile is seen.
Counts grants, waits, and one TOO_LONG or AT_CAPACITY answer when it stopped early; a slot
granted now samples the rate history as acquire.lua's grant does (at most one sample a call).
]]

local cfg = load_config(KEYS[1])
if not cfg or config_outdated(cfg, ARGV[6]) then
  return {4, 0, 0, 0, '', 0}
end
local weight = tonumber(ARGV[1])
local costs = {}
for c in string.gmatch(ARGV[7] or '', '[^,]+') do
  costs[#costs + 1] = tonumber(c)
end
for i = 1, math.max(1, #costs) do
  local refused = too_big(cfg, weight, costs[i] or 0)
  if refused then
    return redis.error_reply(refused)
  end
end
local wanted = tonumber(ARGV[2])
local prefix = ARGV[3]
local ttl = tonumber(ARGV[4])
local max_wait = tonumber(ARGV[5])
local now = now_us()
local st = load_state(KEYS[2], now)
use_history(st, KEYS[6], ARGV[8], ARGV[9])
load_windows(KEYS[2], cfg, st, now)
start_learning_phase(KEYS[2], cfg, st, now)
local interval = interval_us(cfg, current_rate(cfg, st, now))
local room = free_leases(cfg, KEYS[3], now)

local reply = {0, 0, st.generation, now, '', takes_lease(cfg) and 1 or 0}
local seqs = {}
local granted = false
-- The checks in acquire.lua's order, so slot i gets the answer the i-th of `count` acquire.lua
-- calls would get.
for i = 1, wanted do
  local cost = costs[i] or 0
  local wait = next_slot_offset(cfg, st, now, weight, interval, cost)
  if max_wait >= 0 and wait > max_wait then
    reply[1], reply[2] = 2, wait
    count(KEYS[2], 'too_long')
    break
  end
  if i > room then
    reply[1], reply[2] = 3, first_expiry_in(KEYS[3], now)
    count(KEYS[2], 'at_capacity')
    break
  end
  local seq_before = st.cost_seq
  reserve_slot(KEYS, cfg, st, now, prefix .. ':' .. i, ttl, wait, weight, interval, cost)
  seqs[#seqs + 1] = st.cost_seq ~= seq_before and as_string(st.cost_seq) or '-1'
  granted = granted or wait == 0
  reply[#reply + 1] = now + wait
end

reply[5] = table.concat(seqs, ',')
if #reply > 6 then
  store_time(KEYS[2], 'tat', now, st.tat)
  store_windows(KEYS[2], st, now)
end
if granted then
  store_time(KEYS[2], 'granted_tat', now, st.granted_tat)
end
renew_bucket({KEYS[1], KEYS[2], KEYS[3]}, cfg, st, now,
  #reply > 6 and reply[#reply] + ttl or 0, KEYS[5])
return reply
