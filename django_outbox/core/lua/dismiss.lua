#!lua flags=allow-oom
-- dismiss: remove one entry whatever its status (its dedupe marker stays). It only
-- frees memory, so it runs on a server at maxmemory. An entry staged under a live
-- lease, or the entry the lease is held for, is busy; a delivered entry whose signal
-- is owed is not found. A removed entry's ending, dismissed, is recorded for the pages
-- (lib/endings.lua: a few bytes against the entry it frees).
-- ARGV[6] entry ID  ARGV[7] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'removed' | 'not_found' | 'busy', version, count, watched, removed entry}.
--@include entry users operator endings hinted
local id, history_ttl = ARGV[6], tonumber(ARGV[7])

return hinted(function()
  local where, raw = locate(id)
  if where == nil then return raw end  -- the reply: not_found or busy
  redis.call('LREM', where == 'staged' and D or Q, 1, raw)
  uncount((split(raw)))
  record_ending(id, 'dismissed')
  return operator_reply('removed', 1, {raw}, history_ttl)
end)
