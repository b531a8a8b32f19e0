-- accept: append one entry to a session's queue, atomically with its dedupe
-- marker, cap check and indices (README "How it is stored").
-- KEYS: the session layout (see _lib.lua), then KEYS[EXTRA] the dedupe marker.
-- ARGV[6] entry JSON  ARGV[7] entry ID  ARGV[8] content fingerprint
-- ARGV[9] cap (0: no cap and no marker, used by seeding)
-- ARGV[10] dedupe TTL (ms)  ARGV[11] the marker's name, "<user digest>:<clientMessageID>"
--   (keys are scoped to the session and the accepting user; see keys.dedupe_marker)
-- ARGV[12] 'queue', or 'staging' (seeding a delivery a dead worker left behind)
-- ARGV[13] the accepting user's digest (keys.user_digest; '' when seeding: not counted)
-- ARGV[14] USER_MAX_QUEUED  ARGV[15] USER_ACCEPTS_PER_MINUTE (0: that bound is off)
-- ARGV[16] HISTORY_WINDOW (ms; 0 or absent: no history is counted)
-- Returns {'ok', version, watched, acceptedAt} | {'own', version, watched, seq, acceptedAt}
-- (this very entry was already written: a replay after a lost reply) | {'duplicate', id}
-- | {'conflict', id} | {'full'} | {'user_full'} (the user's queued entries in the
-- workspace reached USER_MAX_QUEUED) | {'rate_limited', seconds until an accept can
-- succeed} | {'exists'} (seeding an ID already queued). Nothing is
-- written unless the answer is 'ok'. The stored entry gets 'seq' = the returned version
-- and 'acceptedAt' = now on the server's clock (a seeded entry keeps its own), and
-- 'userDigest', counted in the workspace's users HASH until it leaves (_lib.lua uncount).
local raw, id, fp, cap = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
local ttl, marker_name = tonumber(ARGV[10]), ARGV[11]
local marker_key = KEYS[EXTRA]
local user = ARGV[13] or ''
local max_queued, per_minute = tonumber(ARGV[14] or 0), tonumber(ARGV[15] or 0)
local history_ttl = tonumber(ARGV[16] or 0)
local MINUTE = 60000000  -- us
local PRUNE_EVERY = 16  -- versions between prunes of the markers ZSET
local queued, full_at = 0, 0

if cap > 0 then
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
      return {'own', current_version(), watched(), st.seq or 0, st.acceptedAt or ''}
    end
    if mfp == fp then return {'duplicate', mid} end
    return {'conflict', mid or marker}
  end
  if redis.call('LLEN', Q) + redis.call('LLEN', D) >= cap then return {'full'} end
  -- Per-user bounds (README "Per-user bounds"), read before anything is written.
  if user ~= '' then
    queued, full_at = user_state(user)
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
  end
end

if cap == 0 and (find(Q, id) or find(D, id)) then return {'exists'} end
-- The entry's place in the session: its sequence number is the version this
-- accept gives the session (clocks are never compared for order).
local st, content = split(raw)
local version = bump()
st.seq = version
if cap > 0 then st.acceptedAt = iso(NOW) end
-- A parked workspace holds everything accepted into it (any session, old or new)
-- until unpark releases the session (README "Admin": parking pauses a workspace).
local held = cap > 0 and held_reason()
if held then st.status, st.parkedFrom, st.reason = 'parked', 'pending', held end
if user ~= '' then
  st.userDigest = user
  set_user_state(user, queued + 1, full_at)
end
redis.call('RPUSH', ARGV[12] == 'staging' and D or Q, join(st, content))
if cap > 0 then
  count_history('a', 1, history_ttl)
  if held then count_history('p', 1, history_ttl) end
  redis.call('SET', marker_key, id .. ' ' .. fp, 'PX', ttl)
  -- The markers ZSET only lists marker keys for cleanup (their own PX expires them):
  -- its expired members are pruned on one version in PRUNE_EVERY, not on every accept.
  if version % PRUNE_EVERY == 0 then redis.call('ZREMRANGEBYSCORE', MARKERS, '-inf', NOW_MS) end
  redis.call('ZADD', MARKERS, NOW_MS + ttl, marker_name)
end
-- The global indices learn of a session when it is new (cleanup drops it from them
-- when it drops it from SESSIONS, so the two agree).
if redis.call('SADD', SESSIONS, SES) == 1 then
  HINT[4] = 1
  if G > 0 then
    redis.call('SADD', WORKSPACES, WS)
    redis.call('ZADD', ALL_SESSIONS, 'NX', NOW_MS, MEMBER)
  end
end
-- The new entry is the last one, so it can only make the session due now when
-- nothing else decides its due time: in strict order when the session has no
-- score (no lease, no staging, no head); in due order unless a lease holds it.
-- This keeps accept O(1) instead of re-reading the queue.
if cap == 0 or held then
  reindex_and_wake()  -- seeding (the entry may be in any state), or held by a park
  return {'ok', version, watched(), st.acceptedAt}
end
local locked = redis.call('EXISTS', LOCK) == 1
local mode = (ORDERING == 'strict' or locked) and 'NX' or 'LT'
if redis.call('ZADD', DUE, mode, 'CH', NOW_MS, SES) == 1 then
  -- The session's due time moved to now (or it is new): the workspace's earliest due
  -- time can only have moved earlier, to now. Unchanged: the mirror is still exact.
  if G > 0 then redis.call('ZADD', WSDUE, 'LT', NOW_MS, WS) end
  wake()
end
if locked then set_attention(true) end  -- blocked behind the lease
return {'ok', version, watched(), st.acceptedAt}
