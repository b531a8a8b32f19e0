#!lua
-- seed: put a whole entry, in any state, into a session as it is (test harnesses only:
-- django_outbox.testing.seed_entry). No cap, no dedupe marker, not counted for a user
-- or in the history. An entry with status 'delivering' goes to staging, as if a worker
-- had died delivering it; anything else to the queue's tail.
-- ARGV[6] entry JSON  ARGV[7] entry ID  ARGV[8] 'queue' or 'staging'
-- Returns {'ok', version, watched} (the entry got 'seq' = version) | {'exists'} (an
-- entry with that ID is already in the session: nothing is written).
--@include entry lease indices staging hinted
local raw, id, target = ARGV[6], ARGV[7], ARGV[8]

return hinted(function()
  if find(Q, id) or find(D, id) then return {'exists'} end
  local st, content = split(raw)
  local version = bump()
  st.seq = version
  redis.call('RPUSH', target == 'staging' and D or Q, join(st, content))
  if redis.call('SADD', SESSIONS, SES) == 1 then
    HINT[4] = 1
    if G > 0 then
      redis.call('SADD', WORKSPACES, WS)
      redis.call('ZADD', ALL_SESSIONS, 'NX', NOW_MS, MEMBER)
    end
  end
  reindex_and_wake()
  return {'ok', version, watched()}
end)
