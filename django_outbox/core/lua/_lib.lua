-- Shared library, prepended to every outbox script by core/scripts.py.
--
-- Per-session scripts share this KEYS layout:
--   KEYS[1] queue     LIST   FIFO of JSON entries
--   KEYS[2] staging   LIST   entries being delivered right now
--   KEYS[3] lock      STRING lease "<token> <acquired-ms> [<entry-id>]"
--   KEYS[4] version   STRING per-session mutation counter
--   KEYS[5] markers   ZSET   marker name -> marker expiry (ms)
--   KEYS[6] receipt   STRING "<token> <entry-id> <outcome>" of the last settle
--   KEYS[7] due       ZSET   of the workspace: session -> due time (ms)
--   KEYS[8] sessions  SET    of the workspace's sessions
--   KEYS[9] watch     STRING number of WebSocket clients watching the session
--   KEYS[10] attn     ZSET   of the workspace: session -> since (ms), the sessions that
--                     need an operator's eye (kept on a cluster only, see HINT below)
--   KEYS[11] pause    STRING of the workspace: the reason it is parked; while it exists
--                     every entry accepted into the workspace is held as parked
--   KEYS[12] users    HASH of the workspace: user digest -> "<n> <full-at>": n of the
--                     user's entries are queued or in flight (not yet delivered) in the
--                     workspace, and the user's accept bucket is full again at full-at
--                     (us; see accept.lua). An entry carries the digest in its state
--                     ("userDigest"), so each path that removes one counts it out in the
--                     same script (uncount below)
--   KEYS[13..17]      (standalone servers only) global keys: workspaces-due ZSET,
--                     workspaces SET, wake LIST ("<ws> <ses>" items workers BLMPOP),
--                     all-sessions ZSET ("<ws> <ses>" -> first accept, ms) and
--                     attention ZSET ("<ws> <ses>" -> since, ms: sessions holding
--                     error, parked or verifying entries, or pending ones blocked
--                     behind a lease, or staging without a lease) for the admin
-- and this ARGV prefix:
--   ARGV[1] number of global keys passed (0 on a cluster, 5 otherwise)
--   ARGV[2] now, microseconds since the epoch; 0: the server's clock (TIME), what
--           every caller but a test with an injected clock passes
--   ARGV[3] session ID   ARGV[4] workspace ID   ARGV[5] ordering: "strict" or "due"
-- Script-specific KEYS start at EXTRA, script-specific ARGV at 6.
--
-- On a cluster (G = 0) a script cannot touch the global indices: they live in
-- other slots. It records in HINT what it would have written there instead,
-- and core/scripts.py wraps its reply as {reply, HINT}; the client then applies
-- HINT to the workspace's shard with index.lua (see that script for the rules
-- that keep the shard right whatever order hints arrive in).
--
-- Entries are edited without re-encoding client content: split() cuts the
-- state members off at the first structural ',"clientMessageID":' and join()
-- re-encodes only the state, in a fixed member order.

local Q, D, LOCK, VER, MARKERS, RECEIPT, DUE, SESSIONS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local WATCH, WS_ATTENTION, PAUSE, USERS = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local G = tonumber(ARGV[1])
local WSDUE, WORKSPACES, WAKE, ALL_SESSIONS, ATTENTION = KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local MAX_WAKE_ITEMS = 10000
local EXTRA = 13 + G
-- Cluster only: what the global indices need, reported to the client.
--   [1] the workspace's earliest due time (ms) when it moved earlier, else -1
--   [2] 1: wake a worker for this session   [3] attention: 1 in, 0 out, -1 unchanged
--   [4] 1: the session is new (or a replay: re-add it)   [5] 1: the session was deleted
--   [6] 1: the workspace has no session left   [7] the session's version
--   [8] 1: a replay, report the due time even if it did not move (a crashed
--       client may never have applied the first report)
local HINT = {-1, 0, -1, 0, 0, 0, 0, 0}
-- Now, in microseconds: the server's clock (TIME) unless the caller passed one
-- (tests). One clock for every process: README "Operations".
local NOW = tonumber(ARGV[2])
if NOW == 0 then
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local NOW_MS = math.floor(NOW / 1000)
local SES, WS, ORDERING = ARGV[3], ARGV[4], ARGV[5]
local MEMBER = (WS or '') .. ' ' .. (SES or '')
-- The one operation an allow-oom copy of a script may run (scripts.py VARIANTS):
-- dismiss and delivered-settles free memory, so they run on a full server; the
-- script's other operations can grow memory and are refused there whole. false
-- in every other script.
local ONLY_OP = false

local MARK = ',"clientMessageID":'
local ORDER = {'id', 'status', 'reason', 'parkedFrom', 'attempts', 'verifyAttempts',
               'transientFails', 'acceptedAt', 'seq', 'lastAttemptAt', 'nextAttemptAt', 'lastError',
               'deliveredAt', 'userDigest'}
local ZERO_OMITTED = {verifyAttempts = true, transientFails = true}

local function split(raw)
  local i = string.find(raw, MARK, 1, true)
  if not i then
    error({err = 'outbox: malformed entry (no clientMessageID member)'})
  end
  return cjson.decode(string.sub(raw, 1, i - 1) .. '}'), string.sub(raw, i)
end

-- cjson writes numbers with 14 significant digits: 1796041140804470 would come
-- back as 1.7960411408045e+15. Integers (seq is a session version, microseconds
-- large) are written exactly.
local function encode_value(v)
  if type(v) == 'number' and v == math.floor(v) and math.abs(v) < 2 ^ 53 then
    return string.format('%.0f', v)
  end
  return cjson.encode(v)
end

local function join(st, content)
  local parts = {}
  for _, k in ipairs(ORDER) do
    local v = st[k]
    if v ~= nil and v ~= cjson.null and not (ZERO_OMITTED[k] and v == 0) then
      parts[#parts + 1] = '"' .. k .. '":' .. encode_value(v)
    end
  end
  return '{' .. table.concat(parts, ',') .. content
end

local function id_prefix(id)
  return '{"id":' .. cjson.encode(id) .. ','
end

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

-- settle_next.lua only: what its settle half leaves its claim half, so that the claim
-- does not read again what the settle has just read or written. ACK_SETTLED: the
-- settled entry is among the IDs the claim acknowledges, so the settle removes it from
-- staging at once instead of marking it delivered there for the claim to remove.
-- CARRIED: {owner = the lease token, staging = the staging list as it is now}, set by
-- a settle that recorded a delivery under the lease. Both nil in every other script.
local ACK_SETTLED, CARRIED = nil, nil

local function lock_parts()
  local v = redis.call('GET', LOCK)
  if not v then return nil end
  local owner, acquired, entry = string.match(v, '^(%S+) (%S+) ?(%S*)$')
  return owner, tonumber(acquired), entry
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

local ATTENTION_STATES = {'"status":"error"', '"status":"parked"', '"status":"verifying"'}

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

-- Keep the due index exact for this session and (on standalone) its workspace,
-- and the admin's attention index. items (the queue, as LRANGE Q would return it
-- now), staged (LLEN D now) and pttl (PTTL of the lease now: a script's clock stands
-- still, so right after SET ... PX ttl it is ttl) may be passed by a caller that
-- already has them; nil: read here.
local function reindex(items, staged, pttl)
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

-- 1 if a WebSocket client watches the session (then events are worth publishing).
-- Read once per script: no per-session script writes WATCH (sockets.lua does), and a
-- script that runs two transitions (settle_next.lua) asks twice.
local WATCHED = nil
local function watched()
  if WATCHED == nil then WATCHED = tonumber(redis.call('GET', WATCH) or 0) > 0 and 1 or 0 end
  return WATCHED
end

-- The reason new entries of this session are held, or nil: the workspace is parked
-- (PAUSE holds 'reason') and unpark has not released this session yet.
local function held_reason()
  local reason = redis.call('HGET', PAUSE, 'reason')
  if reason and redis.call('HEXISTS', PAUSE, 'released:' .. SES) == 0 then return reason end
  return nil
end

local function current_version()
  return tonumber(redis.call('GET', VER) or version_floor())
end

-- The reply of a transition over some of the session's entries:
-- {result, version, count, watched, changed entries...}. Reindexes, wakes a worker
-- and bumps the version only if an entry changed.
local function changed_reply(result, count, changed)
  local v
  if #changed > 0 then
    reindex_and_wake()
    v = bump()
  else
    v = current_version()
  end
  local out = {result, v, count, watched()}
  for _, c in ipairs(changed) do out[#out + 1] = c end
  return out
end

-- A staged entry whose delivery is confirmed but whose entry_delivered
-- receivers have not been acknowledged yet: the signal is still owed.
local function is_done(st)
  return st.deliveredAt ~= nil and st.deliveredAt ~= cjson.null
end

-- A user's state in USERS (README "Per-user bounds"): queued entries in the workspace
-- and the time (us) at which the user's accept bucket is full again.
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

-- Staged entries whose signal is owed, as raw JSON. staged: the staging list
-- as the caller read it (LRANGE D), or nil to read it here.
local function owed_signals(staged)
  local owed = {}
  for _, raw in ipairs(staged or redis.call('LRANGE', D, 0, -1)) do
    if is_done((split(raw))) then owed[#owed + 1] = raw end
  end
  return owed
end

-- Find an entry by ID in a list: index (0-based), raw, the list's length and the
-- list as read; or nil, nil, the list's length and the list.
local function find(key, id)
  local prefix = id_prefix(id)
  local items = redis.call('LRANGE', key, 0, -1)
  for i, raw in ipairs(items) do
    if string.sub(raw, 1, #prefix) == prefix then return i - 1, raw, #items, items end
  end
  return nil, nil, #items, items
end

-- Accept order: the per-session sequence number accept.lua gives every entry
-- (the session's version at that moment). Clocks are not compared: two web
-- servers' clocks may disagree, and equal timestamps would tie.
local function later(a, b)
  local sa, sb = a.seq, b.seq
  if sa ~= nil and sa ~= cjson.null and sb ~= nil and sb ~= cjson.null then return sa > sb end
  return a.acceptedAt > b.acceptedAt
end

-- The queued entry (raw) that an entry with state st goes back in front of,
-- or nil for the tail. Read-only: call it before any write of the transition.
local function pivot_for(st)
  for _, other in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    if later((split(other)), st) then return other end
  end
  return nil
end

local function insert_before(pivot, raw)
  if pivot then
    redis.call('LINSERT', Q, 'BEFORE', pivot, raw)
  else
    redis.call('RPUSH', Q, raw)
  end
end

-- Move staged entries left by a holder that is gone back into the queue as
-- verifying: the interrupted attempt's outcome is unknown. An entry already in
-- the queue (same ID) is not added twice. Returns the moved entries. staged: the
-- staging list as the caller read it (LRANGE D), or nil to read it here.
local function recover_staged(staged)
  local moved = {}
  staged = staged or redis.call('LRANGE', D, 0, -1)
  if #staged == 0 then return moved end  -- no staging list: nothing to move or delete
  local keep = {}
  for _, raw in ipairs(staged) do
    local st, content = split(raw)
    if is_done(st) then
      keep[#keep + 1] = raw  -- delivered; only its signal is owed (see claim.lua)
    elseif not find(Q, st.id) then
      if st.status == 'parked' then
        st.parkedFrom = 'verifying'
      else
        st.status = 'verifying'
      end
      st.verifyAttempts = 0
      st.nextAttemptAt = nil
      local new = join(st, content)
      insert_before(pivot_for(st), new)
      moved[#moved + 1] = new
    end
  end
  redis.call('DEL', D)
  if #keep > 0 then redis.call('RPUSH', D, unpack(keep)) end
  return moved
end

local function backoff(base, cap, n)
  local delay = base * (2 ^ (n - 1))
  if delay > cap then delay = cap end
  return delay
end

-- Per-minute history (README "Dashboard"): add n to `field` of this minute's HASH of
-- the workspace (in its slot: legal on a cluster though not in KEYS) and, on a
-- standalone server, of the total one; keys.py KeySpace.history names the same keys
-- (PAUSE is '<prefix>pause:{<ws>}'). The TTL (ms; 0: history off) is set when a field
-- is first written, so it costs one command per key per event.
local function count_history(field, n, ttl_ms)
  if not ttl_ms or ttl_ms <= 0 or n <= 0 then return end
  local minute = math.floor(NOW / 60000000)
  local prefix = string.sub(PAUSE, 1, #PAUSE - #WS - 8)
  local hist = prefix .. 'hist:{' .. WS .. '}:' .. minute
  if redis.call('HINCRBY', hist, field, n) == n then redis.call('PEXPIRE', hist, ttl_ms) end
  if G > 0 then
    hist = prefix .. 'hist:' .. minute
    if redis.call('HINCRBY', hist, field, n) == n then redis.call('PEXPIRE', hist, ttl_ms) end
  end
end
