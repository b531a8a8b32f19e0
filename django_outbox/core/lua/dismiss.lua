#!lua flags=allow-oom
-- dismiss: remove one entry whatever its status (its dedupe marker stays). It only
-- frees memory, so it runs on a server at maxmemory. An entry staged under a live
-- lease, or the entry the lease is held for, is busy; a delivered entry whose signal
-- is owed is not found.
-- ARGV[6] entry ID  ARGV[7] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'removed' | 'not_found' | 'busy', version, count, watched, removed entry}.
--@include entry lease users staging operator hinted
local id, history_ttl = ARGV[6], tonumber(ARGV[7])

return hinted(function()
  local owner, _, lock_entry = lock_parts()
  local _, staged = find(D, id)
  if staged and is_done((split(staged))) then return unchanged_reply('not_found') end
  if staged then
    if owner then return unchanged_reply('busy') end
    redis.call('LREM', D, 1, staged)
    uncount((split(staged)))
    return operator_reply('removed', 1, {staged}, history_ttl)
  end
  local _, raw = find(Q, id)
  if not raw then return unchanged_reply('not_found') end
  if owner and lock_entry == id then return unchanged_reply('busy') end
  redis.call('LREM', Q, 1, raw)
  uncount((split(raw)))
  return operator_reply('removed', 1, {raw}, history_ttl)
end)
