--[[
lib/config.lua: the limits as the config hash holds them (configure.lua writes them).

Windows: besides rate per period, the config may list windows "rate,period,burst,unit;...".
A request takes `weight` units of each "requests" window and its `cost` units of each "cost"
window (tokens); a window it takes nothing from does not hold it back. The adaptive rate and
the generations are the main rate's; blocks stop every window.
]]

-- The config's windows ("rate,period,burst,unit;..."), each with its interval in µs per unit.
local function parse_windows(spec)
  local windows = {}
  for rate, period, burst, unit in string.gmatch(spec or '', '([^,;]+),([^,;]+),([^,;]+),([^,;]+)') do
    local w = {rate = tonumber(rate), period = tonumber(period), burst = tonumber(burst),
      unit = unit, cost = unit == 'cost'}
    w.interval = w.period * 1000000 / w.rate
    windows[#windows + 1] = w
  end
  return windows
end

-- The config hash fields load_config reads.
local CONFIG_FIELDS = {'rate', 'period', 'burst', 'max_concurrency', 'adaptive', 'min_rate',
  'decrease_factor', 'recovery_seconds', 'version', 'windows', 'learn'}

local function load_config(key)
  -- named locals in CONFIG_FIELDS' order (see load_state: no table by name per call)
  local rate, period, burst, max_concurrency, adaptive, min_rate, decrease_factor,
    recovery_seconds, version, windows, learn =
    unpack(redis.call('HMGET', key, unpack(CONFIG_FIELDS)))
  if not rate then
    return nil
  end
  return {
    windows = parse_windows(windows),
    rate = tonumber(rate),
    period = tonumber(period),
    burst = tonumber(burst),
    max_concurrency = tonumber(max_concurrency),
    adaptive = adaptive == '1',
    min_rate = tonumber(min_rate),
    decrease_factor = tonumber(decrease_factor),
    recovery_seconds = tonumber(recovery_seconds),
    version = tonumber(version) or 0,
    learn = learn ~= '0',
  }
end

-- The stored limits are older than the caller's (changed while Redis was down, or rolled back
-- by a Redis restored from an old snapshot): the caller must configure before anything is
-- granted, so the database's limits win. caller_version 0 (unversioned) accepts any.
local function config_outdated(cfg, caller_version)
  return cfg.version < (tonumber(caller_version) or 0)
end
