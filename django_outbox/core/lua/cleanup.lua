#!lua flags=allow-oom
-- cleanup: delete every key of one session, its dedupe markers included, and
-- drop it from the workspace's indices. Idempotent.
-- KEYS[EXTRA..] dedupe marker keys listed in the markers ZSET when the caller read it.
-- ARGV[6..] the names of those markers (members of the markers ZSET), in the same order.
-- Returns {'done', keys removed, version, watched, removed entries...} or
-- {'again', keys removed so far} when markers were added after the caller read the
-- list (call again with a fresh list). The version is the session's last one (its
-- VER key is deleted; the next change starts above it, see bump in lib/lease.lua), so
-- watchers can be told the entries are gone.
--@include entry lease indices users hinted

return hinted(function()
  local removed = 0
  for i = EXTRA, #KEYS do
    removed = removed + redis.call('DEL', KEYS[i])
  end
  local had_markers = redis.call('EXISTS', MARKERS)
  for i = 6, #ARGV do
    redis.call('ZREM', MARKERS, ARGV[i])
  end
  if redis.call('ZCARD', MARKERS) > 0 then return {'again', removed} end
  local gone, gone_states = {}, {}
  for _, list in ipairs({Q, D}) do
    for _, raw in ipairs(redis.call('LRANGE', list, 0, -1)) do
      local st = split(raw)
      if not is_done(st) then
        gone[#gone + 1] = raw
        gone_states[#gone_states + 1] = st
      end
    end
  end
  local version = bump()
  local shared_before = redis.call('EXISTS', SESSIONS, DUE, USERS)
  for _, st in ipairs(gone_states) do uncount(st) end
  removed = removed + had_markers + redis.call('DEL', Q, D, LOCK, VER, RECEIPT, ENDED)
  redis.call('ZREM', WS_ATTENTION, SES)
  redis.call('SREM', SESSIONS, SES)
  redis.call('ZREM', DUE, SES)
  -- No session left, so no entry: whatever the users HASH still says is drift (entries
  -- removed by hand, or by an older version's scripts), and it ends here.
  if redis.call('EXISTS', SESSIONS) == 0 then redis.call('DEL', USERS) end
  removed = removed + shared_before - redis.call('EXISTS', SESSIONS, DUE, USERS)
  sync_workspace()
  HINT[5] = 1
  HINT[6] = 1 - redis.call('EXISTS', SESSIONS)
  if G > 0 then
    redis.call('ZREM', ALL_SESSIONS, MEMBER)
    redis.call('ZREM', ATTENTION, MEMBER)
    if redis.call('EXISTS', SESSIONS) == 0 then redis.call('SREM', WORKSPACES, WS) end
  end
  local out = {'done', removed, version, watched()}
  for _, raw in ipairs(gone) do out[#out + 1] = raw end
  return out
end)
