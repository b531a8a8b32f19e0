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
