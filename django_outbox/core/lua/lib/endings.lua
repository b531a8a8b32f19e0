-- endings: how the session's recent entries ended, kept for a page that was not connected
-- when they did (docs/reference/websocket.md#how-prompts-ended). ENDED (lib/layout.lua)
-- is a LIST, newest first, of "<entry-id> <how> <ms>" items: how is delivered, dismissed,
-- cancelled or expired, ms the transition's clock (lib/now.lua). A read takes the newest
-- ENDINGS_KEPT items younger than ENDINGS_TTL_MS; the list is trimmed back to
-- ENDINGS_KEPT items once it holds twice as many, the key expires ENDINGS_TTL_MS after
-- the last ending, and it goes with the session's other keys when an idle session is
-- reclaimed (lib/reclaim.lua) or cleaned up (cleanup.lua): an idle session keeps nothing
-- of it (docs/explanation/storage.md).
--@include layout

local ENDINGS_KEPT, ENDINGS_TTL_MS = 20, 3600000

-- Record that entry `id` ended `how` now. Two commands (the trim: one in ENDINGS_KEPT).
local function record_ending(id, how)
  local n = redis.call('LPUSH', ENDED, id .. ' ' .. how .. ' ' .. NOW_MS)
  if n > 2 * ENDINGS_KEPT then redis.call('LTRIM', ENDED, 0, ENDINGS_KEPT - 1) end
  redis.call('PEXPIRE', ENDED, ENDINGS_TTL_MS)
end

-- The recorded endings a reader is given: the newest ENDINGS_KEPT, none older than
-- ENDINGS_TTL_MS, newest first, as stored.
local function recent_endings()
  local out = {}
  for _, item in ipairs(redis.call('LRANGE', ENDED, 0, ENDINGS_KEPT - 1)) do
    local at = tonumber(string.match(item, ' (%d+)$'))
    if at and NOW_MS - at <= ENDINGS_TTL_MS then out[#out + 1] = item end
  end
  return out
end
