-- reclaim: an idle session costs nothing once its idempotency window has passed.
-- An empty session is looked at again when its last dedupe marker expires
-- (lib/indices.lua reclaim_at); the claim that finds it still empty then deletes its
-- keys and takes it out of its workspace's and the global indices. Its version is
-- not kept, and need not be: a session without one starts above any version it had
-- (lib/lease.lua version_floor), so a client that comes back never sees it go back.
-- The workspace's per-user state of users with nothing left to remember goes too (a
-- bounded number per reclaim, lib/users.lua prune_users).
--@include layout indices users

local function reclaim()
  redis.call('DEL', VER, MARKERS, RECEIPT, ENDED)
  prune_users()
  redis.call('SREM', SESSIONS, SES)
  redis.call('ZREM', DUE, SES)
  set_attention(false)
  sync_workspace()
  HINT[5] = 1  -- gone (and, below, the workspace may have no session left)
  HINT[6] = 1 - redis.call('EXISTS', SESSIONS)
  if G > 0 then
    redis.call('ZREM', ALL_SESSIONS, MEMBER)
    if HINT[6] == 1 then redis.call('SREM', WORKSPACES, WS) end
  end
end
