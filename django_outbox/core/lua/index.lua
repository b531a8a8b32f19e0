#!lua flags=allow-oom
-- index: keep one cluster shard's copies of the global indices (docs/howto/cluster.md).
-- On a cluster the per-session scripts cannot reach the global indices (other
-- slots), so each reports a HINT (see lib/layout.lua) and the client applies it here.
-- All keys share the shard's {s<k>} hash tag.
-- KEYS[1] workspaces-due ZSET (ws -> earliest due, ms)  KEYS[2] workspaces SET
-- KEYS[3] wake LIST  KEYS[4] all-sessions ZSET  KEYS[5] attention ZSET
-- KEYS[6] attention-version HASH ("<ws> <ses>" -> session version of the verdict)
--
-- ARGV[1] = 'hint': ARGV[2] ws  ARGV[3] session  ARGV[4..11] the HINT members
--   (due, wake, attention, new, gone, workspace empty, version; see lib/layout.lua)
--   then ARGV[11] now (ms; 0: the server's clock)  ARGV[12] wake list cap.
--   Rules that make the order hints arrive in harmless:
--   * the due time only ever moves a workspace earlier (ZADD LT): a stale early
--     score costs a worker one look (it then raises the score, see 'drop');
--     a late one would hide work, and no hint can produce one;
--   * an attention verdict applies only if its session version is not older
--     than the last one applied.
--   Returns 'recheck' when the workspace was dropped from the workspaces SET
--   (the caller re-adds it if a session appeared meanwhile), else 'ok'.
-- ARGV[1] = 'drop': ARGV[2] ws  ARGV[3] score (ms) the caller read.
--   Removes the workspace from the due ZSET only if its score is still that one
--   (a worker found nothing due there; it then re-adds the true earliest time).
--   Returns 1 if removed, else 0.
local WSDUE, WORKSPACES, WAKE, ALL_SESSIONS, ATTENTION, ATTNVER =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, ws = ARGV[1], ARGV[2]

if op == 'drop' then
  local score = redis.call('ZSCORE', WSDUE, ws)
  if score and tonumber(score) == tonumber(ARGV[3]) then
    redis.call('ZREM', WSDUE, ws)
    return 1
  end
  return 0
end

if op ~= 'hint' then return redis.error_reply('outbox: unknown index op ' .. tostring(op)) end

local ses = ARGV[3]
local due, wake, attention = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local new, gone, empty = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local version, now_ms, cap = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
if now_ms == 0 then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local member = ws .. ' ' .. ses

if due >= 0 then redis.call('ZADD', WSDUE, 'LT', due, ws) end
if wake == 1 and redis.call('LLEN', WAKE) < cap then redis.call('RPUSH', WAKE, member) end
if new == 1 then
  redis.call('SADD', WORKSPACES, ws)
  redis.call('ZADD', ALL_SESSIONS, 'NX', now_ms, member)
end
if attention >= 0 then
  local seen = tonumber(redis.call('HGET', ATTNVER, member) or -1)
  if version >= seen then
    redis.call('HSET', ATTNVER, member, version)
    if attention == 1 then
      redis.call('ZADD', ATTENTION, 'NX', now_ms, member)
    else
      redis.call('ZREM', ATTENTION, member)
    end
  end
end
if gone == 1 then
  redis.call('ZREM', ALL_SESSIONS, member)
  redis.call('ZREM', ATTENTION, member)
  redis.call('HDEL', ATTNVER, member)
end
if empty == 1 then
  redis.call('SREM', WORKSPACES, ws)
  return 'recheck'
end
return 'ok'
