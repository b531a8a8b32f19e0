-- time: timestamps as stored ('2026-11-30T01:42:39.123456Z') <-> microseconds.
-- Civil date <-> days since 1970-01-01 (H. Hinnant's algorithms).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- Microseconds since the epoch -> '2026-11-30T01:42:39.123456Z'.
local function iso(us)
  local secs = math.floor(us / 1000000)
  local micros = us - secs * 1000000
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  local y, m, d = civil_from_days(days)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%06dZ', y, m, d,
    math.floor(rem / 3600), math.floor((rem % 3600) / 60), rem % 60, micros)
end

-- The inverse of iso(); timestamps are stored only in that fixed form.
local function parse_iso(s)
  local y, m, d, hh, mm, ss, us = string.match(s, '^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)%.(%d+)Z$')
  if not y then
    error({err = 'outbox: malformed timestamp ' .. tostring(s)})
  end
  local days = days_from_civil(tonumber(y), tonumber(m), tonumber(d))
  return ((days * 86400 + tonumber(hh) * 3600 + tonumber(mm) * 60 + tonumber(ss)) * 1000000) + tonumber(us)
end
