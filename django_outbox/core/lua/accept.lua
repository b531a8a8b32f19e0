#!lua
-- accept: append one entry to a session's queue, atomically with its dedupe
-- marker, cap check and indices (docs/explanation/storage.md).
-- KEYS: the session layout (lib/layout.lua), then KEYS[EXTRA] the dedupe marker.
-- ARGV[6] entry JSON  ARGV[7] entry ID  ARGV[8] content fingerprint  ARGV[9] cap
-- ARGV[10] dedupe TTL (ms)  ARGV[11] the marker's name, "<user digest>:<clientMessageID>"
--   (keys are scoped to the session and the accepting user; see keys.dedupe_marker)
-- ARGV[12] the accepting user's digest (keys.user_digest)
-- ARGV[13] USER_MAX_QUEUED  ARGV[14] USER_ACCEPTS_PER_MINUTE (0: that bound is off)
-- ARGV[15] HISTORY_WINDOW (ms; 0: no history is counted)
-- ARGV[16] expires after (us from now on the server's clock; 0: never)
-- ARGV[17] mode: 'queue', 'reject', 'interrupt' (queued as 'queue' is; the caller moves
--   it next and cuts) or 'merge' (docs/howto/steering.md#busy-sessions)
-- Returns {'ok', version, watched, acceptedAt, held} | {'own', version, watched, seq,
-- acceptedAt, held} (this very entry was already written: a replay after a lost reply),
-- where held is the park reason when the entry is stored parked, else '' | {'duplicate', id}
-- | {'conflict', id} | {'session_busy'} (mode 'reject' and the session has something
-- pending, in flight or being verified) | {'full'} | {'user_full'} (the user's queued entries in the
-- workspace reached USER_MAX_QUEUED) | {'rate_limited', seconds until an accept can
-- succeed}. Nothing is written unless the answer is 'ok'. The stored entry gets 'seq' =
-- the returned version and 'acceptedAt' = now on the server's clock, and 'userDigest',
-- counted in the workspace's users HASH until it leaves (lib/users.lua uncount).
--@include entry time lease indices users staging history hinted

local raw, id, fp, cap = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
local ttl, marker_name = tonumber(ARGV[10]), ARGV[11]
local user = ARGV[12]
local max_queued, per_minute = tonumber(ARGV[13]), tonumber(ARGV[14])
local history_ttl = tonumber(ARGV[15])
local expires_after, mode = tonumber(ARGV[16] or '0'), ARGV[17] or 'queue'
local MINUTE = 60000000  -- us

-- The reason new entries of this session are held, or nil: the workspace is parked
-- (PAUSE holds 'reason') and unpark has not released this session yet.
local function held_reason()
  local reason = redis.call('HGET', PAUSE, 'reason')
  if reason and redis.call('HEXISTS', PAUSE, 'released:' .. SES) == 0 then return reason end
  return nil
end

-- Is an entry staged and not yet delivered? (One whose delivery is confirmed and whose
-- signal alone is owed is done: lib/staging.lua owed_signals.)
local function staged_undelivered()
  local staged = redis.call('LRANGE', D, 0, -1)
  return #owed_signals(staged) < #staged
end

-- Does the session have something pending, in flight or being verified? (A lease or a
-- staged entry not yet delivered, or a queued entry in one of those states; error, parked
-- and expired entries wait for a person, not for the agent, and a delivered entry whose
-- signal is owed is done.)
local function session_busy()
  if redis.call('EXISTS', LOCK) == 1 or staged_undelivered() then return true end
  for _, raw in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    local state = string.sub(raw, 1, string.find(raw, MARK, 1, true) or #raw)
    if string.find(state, '"status":"pending"', 1, true)
        or string.find(state, '"status":"verifying"', 1, true) then
      return true
    end
  end
  return false
end

return hinted(function()
  local marker_key = KEYS[EXTRA]
  local marker = redis.call('GET', marker_key)
  if marker then
    local mid, mfp = string.match(marker, '^(%S+) (%S+)$')
    -- A replay (or a resend after the first reply was lost): report the indices
    -- again on a cluster, in case the first caller died before applying them.
    HINT[4], HINT[8] = 1, 1
    if mid == id then
      local _, mine = find(Q, id)
      if not mine then _, mine = find(D, id) end
      local st = mine and split(mine) or {}
      local parked = st.status == 'parked' and st.reason or ''
      return {'own', current_version(), watched(), st.seq or 0, st.acceptedAt or '', parked}
    end
    if mfp == fp then return {'duplicate', mid} end
    return {'conflict', mid or marker}
  end
  -- Decided here, before anything is written: a refused prompt leaves no marker.
  if mode == 'reject' and session_busy() then return {'session_busy'} end
  local held_entries = redis.call('LLEN', Q) + redis.call('LLEN', D)
  if held_entries >= cap then return {'full'} end
  -- Per-user bounds (docs/explanation/idempotency.md, "Per-user bounds"), read before
  -- anything is written.
  local queued, full_at = user_state(user)
  if max_queued > 0 and queued >= max_queued then return {'user_full'} end
  if per_minute > 0 then
    -- A bucket of per_minute accepts, refilled one every MINUTE / per_minute (GCRA):
    -- its state is the time at which it is full again. An accept takes one; it is
    -- refused while taking one would put that time more than a minute ahead.
    full_at = math.max(full_at, NOW) + math.floor(MINUTE / per_minute)
    if full_at - NOW > MINUTE then
      return {'rate_limited', math.max(1, math.ceil((full_at - MINUTE - NOW) / 1000000))}
    end
  end

  -- The entry's place in the session: its sequence number is the version this
  -- accept gives the session (clocks are never compared for order).
  local st, content = split(raw)
  local version = bump()
  st.seq = version
  st.acceptedAt = iso(NOW)
  if expires_after > 0 then st.expiresAt = iso(NOW + expires_after) end
  if mode ~= 'queue' then st.mode = mode end
  -- A parked workspace holds everything accepted into it (any session, old or new)
  -- until unpark releases the session (docs/explanation/lifecycle.md, "Parking a
  -- workspace").
  local held = held_reason()
  if held then st.status, st.parkedFrom, st.reason = 'parked', 'pending', held end
  st.userDigest = user
  set_user_state(user, queued + 1, full_at)
  redis.call('RPUSH', Q, join(st, content))
  count_history('a', 1, history_ttl)
  if held then count_history('p', 1, history_ttl) end
  redis.call('SET', marker_key, id .. ' ' .. fp, 'PX', ttl)
  -- The markers ZSET only lists marker keys for cleanup (their own PX expires them):
  -- every accept prunes a bounded number of its expired members (lib/indices.lua).
  prune_markers()
  redis.call('ZADD', MARKERS, NOW_MS + ttl, marker_name)
  -- The global indices learn of a session when it is new (cleanup drops it from them
  -- when it drops it from SESSIONS, so the two agree).
  if redis.call('SADD', SESSIONS, SES) == 1 then
    HINT[4] = 1
    if G > 0 then
      redis.call('SADD', WORKSPACES, WS)
      redis.call('ZADD', ALL_SESSIONS, 'NX', NOW_MS, MEMBER)
    end
  elseif held_entries == 0 then
    -- An emptied session's version and markers were given an expiry (lib/indices.lua
    -- expire_idle); holding an entry again, they keep without one until it empties.
    redis.call('PERSIST', VER)
    redis.call('PERSIST', MARKERS)
  end
  if held then
    reindex_and_wake()
    return {'ok', version, watched(), st.acceptedAt, held}
  end
  -- The new entry is the last one, so it can only make the session due now when
  -- nothing else decides its due time: in strict order when the session has no
  -- score (no lease, no staging, no head) or was empty (its score, then, is when it
  -- would have been reclaimed: lib/reclaim.lua); in due order unless a lease holds it.
  -- This keeps accept O(1) instead of re-reading the queue.
  local locked = redis.call('EXISTS', LOCK) == 1
  local changed
  if held_entries == 0 and not locked then
    changed = redis.call('ZADD', DUE, 'CH', NOW_MS, SES)  -- whatever its reclaim time was
  else
    local mode = (ORDERING == 'strict' or locked) and 'NX' or 'LT'
    changed = redis.call('ZADD', DUE, mode, 'CH', NOW_MS, SES)
  end
  if changed == 1 then
    -- The session's due time moved to now (or it is new): the workspace's earliest due
    -- time can only have moved earlier, to now, or (an empty session that was overdue
    -- for reclaiming) later, where the mirror may stay early. Unchanged: still exact.
    if G > 0 then redis.call('ZADD', WSDUE, 'LT', NOW_MS, WS) end
    wake()
  end
  if locked then set_attention(true) end  -- blocked behind the lease
  return {'ok', version, watched(), st.acceptedAt, ''}
end)
