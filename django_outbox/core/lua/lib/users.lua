-- users: the per-user bounds' state (docs/explanation/idempotency.md, "Per-user bounds").
--@include layout

-- A user's state in USERS: queued entries in the workspace and the time (us) at which
-- the user's accept bucket is full again.
local function user_state(user)
  local n, full_at = string.match(redis.call('HGET', USERS, user) or '', '^(%d+) (%d+)$')
  return tonumber(n) or 0, tonumber(full_at) or 0
end

-- A user with nothing queued and a full bucket is no different from one never seen:
-- the field goes, so the HASH holds only users with something to remember.
local function set_user_state(user, n, full_at)
  if n <= 0 and full_at <= NOW then
    redis.call('HDEL', USERS, user)
  else
    redis.call('HSET', USERS, user, math.max(n, 0) .. ' ' .. string.format('%.0f', full_at))
  end
end

-- Count an entry out of its user's queued entries. Called once per entry, by the
-- transition that removes it or marks it delivered; entries accepted without a digest
-- (seeded, or by an older version) were never counted in. Never below zero.
local function uncount(st)
  local user = st.userDigest
  if type(user) ~= 'string' then return end
  local n, full_at = user_state(user)
  set_user_state(user, n - 1, full_at)
end

-- Users remembered past their time: nothing queued and the bucket full again. A field is
-- dropped by the transition that finds it so (set_user_state), but a user's last entry
-- usually leaves within the minute of its accept, bucket not yet full, and the user may
-- never come back: the reclaim of an idle session (lib/reclaim.lua) drops up to
-- USERS_PRUNED_PER_CALL such fields of its workspace, and the HASH goes with the last one.
local USERS_PRUNED_PER_CALL = 64
local function prune_users()
  local page = redis.call('HSCAN', USERS, 0, 'COUNT', USERS_PRUNED_PER_CALL)[2]
  local stale = {}
  for i = 1, #page, 2 do
    local n, full_at = string.match(page[i + 1], '^(%d+) (%d+)$')
    if tonumber(n) == 0 and tonumber(full_at) <= NOW then stale[#stale + 1] = page[i] end
    if #stale >= USERS_PRUNED_PER_CALL then break end
  end
  if #stale > 0 then redis.call('HDEL', USERS, unpack(stale)) end
end
