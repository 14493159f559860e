--[[
lib/time.lua: the clock and the numbers every other part computes with.

The limiter's library (lib/*.lua) is joined in scripts.LIBRARY's order in front of each script,
so no library file has KEYS, ARGV or a return value of its own; a file uses only what the files
before it define.

Units: every time is a count of microseconds on the Redis server's clock (TIME), never a
worker's clock, because worker clocks drift apart between machines. Rates are requests per
config.period seconds. Lua numbers are doubles: a microsecond epoch (~1.8e15) is exact as a whole
number but has a resolution of only 0.25 us, so adding a fractional interval (1e6/150 us) to it
at every grant would drift the pace by parts per million. Schedule times are therefore stored as
whole microseconds plus a fraction (<name>_us, <name>_frac) and computed as offsets from now.
]]

-- Redis < 5 replicates scripts verbatim, which TIME makes non-deterministic; later versions
-- replicate effects and keep this function only as a no-op. The function library (Redis 7+)
-- leaves this statement out: its load may not touch redis.call's side of the API.
if redis.replicate_commands then
  pcall(redis.replicate_commands)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A number as Redis replies carry it without losing precision (Lua numbers become integers).
local function as_string(x)
  return string.format('%.17g', x)
end

-- The fields `names` of hash `key` in one HMGET, as a table by name (each field's name prefixed
-- with `prefix` in the hash, when given); an absent field is absent from the table.
local function read_fields(key, names, prefix)
  local fields = names
  if prefix then
    fields = {}
    for i, name in ipairs(names) do
      fields[i] = prefix .. name
    end
  end
  local values = redis.call('HMGET', key, unpack(fields))
  local by_name = {}
  for i, name in ipairs(names) do
    if values[i] then
      by_name[name] = values[i]
    end
  end
  return by_name
end
