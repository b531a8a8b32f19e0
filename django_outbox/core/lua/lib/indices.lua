-- indices: the session's head and due time, and the indices that point at it: the
-- workspace's due ZSET (and on standalone servers its global mirror), the wake list
-- and the admin's attention index. On a cluster the global ones are reported in HINT.
--@include layout entry time

local MAX_WAKE_ITEMS = 10000

-- Due time (us) of a deliverable entry (pending or verifying), or nil.
local function gate(st)
  if st.status ~= 'pending' and st.status ~= 'verifying' then return nil end
  local next_at = st.nextAttemptAt
  if next_at == nil or next_at == cjson.null then return 0 end
  return parse_iso(next_at)
end

-- The session's head: the entry to work on next, and the earliest due time.
-- strict: the first pending/verifying entry, due or not (nothing overtakes it).
-- due:    the first pending/verifying entry that is due now.
-- Returns index (0-based), raw, state, content, or nil and the next due time.
local function find_head(items)
  local next_due = nil
  for i, raw in ipairs(items) do
    local st, content = split(raw)
    local due = gate(st)
    if due ~= nil then
      if due <= NOW then return i - 1, raw, st, content end
      if ORDERING == 'strict' then return nil, due end
      if next_due == nil or due < next_due then next_due = due end
    end
  end
  return nil, next_due
end

-- On standalone servers, mirror the workspace's earliest due time globally.
local function sync_workspace()
  if G == 0 then return end
  local first = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  if first[1] then
    redis.call('ZADD', WSDUE, first[2], WS)
  else
    redis.call('ZREM', WSDUE, WS)
  end
end

-- Tell an idle worker at once that this session has work due now (workers
-- also find it on their next tick through the due index; this only cuts latency).
local function wake()
  if redis.call('EXISTS', LOCK) == 1 then return end
  if G == 0 then
    HINT[2] = 1
    return
  end
  if redis.call('LLEN', WAKE) < MAX_WAKE_ITEMS then
    redis.call('RPUSH', WAKE, WS .. ' ' .. SES)
  end
end

local ATTENTION_STATES = {'"status":"error"', '"status":"parked"', '"status":"verifying"',
                          '"status":"expired"'}

-- Does the session need an operator's eye? (Looks only at the state members.)
local function needs_attention(items, locked, staged)
  if staged > 0 and not locked then return true end
  for _, raw in ipairs(items) do
    local state = string.sub(raw, 1, string.find(raw, MARK, 1, true) or #raw)
    for _, pattern in ipairs(ATTENTION_STATES) do
      if string.find(state, pattern, 1, true) then return true end
    end
    if locked and string.find(state, '"status":"pending"', 1, true) then return true end
  end
  return false
end

-- Put the session in (or out of) the admin's attention index. On a cluster
-- the workspace's own attention ZSET is exact and a change is reported in HINT.
local function set_attention(needed)
  if G > 0 then
    if needed then
      redis.call('ZADD', ATTENTION, 'NX', NOW_MS, MEMBER)
    else
      redis.call('ZREM', ATTENTION, MEMBER)
    end
    return
  end
  local changed
  if needed then
    changed = redis.call('ZADD', WS_ATTENTION, 'NX', NOW_MS, SES)
  else
    changed = redis.call('ZREM', WS_ATTENTION, SES)
  end
  if changed == 1 then HINT[3] = needed and 1 or 0 end
end

-- The workspace's earliest due time (ms), or nil.
local function earliest_due()
  local first = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  if first[2] then return tonumber(first[2]) end
  return nil
end

-- Expired members of the markers ZSET removed per call, at most: the oldest ones (it is
-- scored by expiry), so an accept removes more than it adds and the set holds only live
-- markers plus what one call could not take.
local MARKERS_PRUNED_PER_CALL = 32
-- How long a session's version outlives its idempotency window once the session is
-- empty (ms): the worker's claim reclaims the session at the window's end (lib/reclaim.lua);
-- this expiry frees it where no worker runs (docs/explanation/storage.md#what-lives-how-long).
local IDLE_VERSION_GRACE_MS = 3600000

-- Remove up to MARKERS_PRUNED_PER_CALL expired members of the markers ZSET (their own
-- keys expired by PX already). Two commands: ZCOUNT, then ZREMRANGEBYRANK when needed.
local function prune_markers()
  local stale = redis.call('ZCOUNT', MARKERS, '-inf', NOW_MS)
  if stale > 0 then
    redis.call('ZREMRANGEBYRANK', MARKERS, 0, math.min(stale, MARKERS_PRUNED_PER_CALL) - 1)
  end
end

-- When an empty session (nothing queued, staged or leased) is looked at again: when the
-- last of its dedupe markers expires (ms; now if it has none or they have all expired).
-- Then its idempotency window has passed, and the claim that finds it still empty
-- reclaims its keys (lib/reclaim.lua). The markers ZSET is scored by expiry; its expired
-- members are pruned here too (prune_markers).
local function reclaim_at()
  prune_markers()
  local last = redis.call('ZRANGE', MARKERS, -1, -1, 'WITHSCORES')
  if last[2] then return math.max(tonumber(last[2]), NOW_MS) end
  return NOW_MS
end

-- An empty session's keys without an expiry of their own get one, `at` being its reclaim
-- time (ms, the transition's clock; relative, so an injected clock holds): the markers
-- ZSET when its newest marker expires, the version IDLE_VERSION_GRACE_MS later. A session
-- nobody reclaims keeps nothing forever; one accepted into again keeps both without an
-- expiry (accept.lua PERSISTs them; a version that did expire restarts above, lib/lease.lua).
local function expire_idle(at)
  local left = math.max(at - NOW_MS, 0)
  redis.call('PEXPIRE', VER, left + IDLE_VERSION_GRACE_MS)
  redis.call('PEXPIRE', MARKERS, math.max(left, 1))
end

-- Keep the due index exact for this session and (on standalone) its workspace,
-- and the admin's attention index. items (the queue, as LRANGE Q would return it
-- now), staged (LLEN D now) and pttl (PTTL of the lease now: a script's clock stands
-- still, so right after SET ... PX ttl it is ttl) may be passed by a caller that
-- already has them; nil: read here. empty_at: reclaim_at() when the caller has read
-- it for an empty session.
local function reindex(items, staged, pttl, empty_at)
  local score = nil
  pttl = pttl or redis.call('PTTL', LOCK)  -- -2: no lease; -1: a lease without a TTL
  local locked = pttl ~= -2
  staged = staged or redis.call('LLEN', D)
  items = items or redis.call('LRANGE', Q, 0, -1)
  if locked then
    -- In flight: look again when the lease would expire (renewals push it on).
    score = NOW_MS + math.max(pttl, 0)
  elseif staged > 0 then
    score = NOW_MS  -- staged entries without a lease: recover them now
  elseif #items == 0 then
    score = empty_at or reclaim_at()  -- empty: look again to reclaim it
    expire_idle(score)
  else
    local idx, due = find_head(items)
    if idx ~= nil then score = NOW_MS elseif due ~= nil then score = math.floor(due / 1000) end
  end
  set_attention(needs_attention(items, locked, staged))
  if score then
    redis.call('ZADD', DUE, score, SES)
  else
    redis.call('ZREM', DUE, SES)
  end
  sync_workspace()
  return score
end

-- reindex(), then wake a worker if the session is due now.
local function reindex_and_wake()
  local score = reindex()
  if score ~= nil and score <= NOW_MS then wake() end
end
