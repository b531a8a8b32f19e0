-- lease: the session's small keys: its lease, its version and its watcher count.
--@include layout

local function lock_parts()
  local v = redis.call('GET', LOCK)
  if not v then return nil end
  local owner, acquired, entry = string.match(v, '^(%S+) (%S+) ?(%S*)$')
  return owner, tonumber(acquired), entry
end

-- A session's version never goes backwards, even across cleanup_workspace (which
-- deletes VER): a session without one starts at now in microseconds, above any
-- version it could have had, since a version grows by one per change and no session
-- changes more than once a microsecond. Versions are opaque, increasing integers.
local function version_floor()
  return NOW
end

local function bump()
  local v = redis.call('INCR', VER)
  if v == 1 then
    v = version_floor()
    redis.call('SET', VER, v)
  end
  return v
end

local function current_version()
  return tonumber(redis.call('GET', VER) or version_floor())
end

-- 1 if a WebSocket client watches the session (then events are worth publishing).
-- Read once per script: no per-session script writes WATCH (sockets.lua does), and a
-- script that runs two transitions (settle_next.lua) asks twice.
local WATCHED = nil
local function watched()
  if WATCHED == nil then WATCHED = tonumber(redis.call('GET', WATCH) or 0) > 0 and 1 or 0 end
  return WATCHED
end
