#!lua flags=allow-oom
-- release: give up the lease (compare-and-delete: a holder never deletes
-- someone else's lease), first acknowledging delivered entries whose
-- entry_delivered receivers have run. Staged entries that are not delivered
-- stay staged and are recovered as verifying by the next claim.
-- ARGV[6] lease token  ARGV[7..] IDs of delivered entries to acknowledge.
-- An acknowledgement is applied while the lease is ours or nobody's: if a new
-- holder took the session it owns the owed signal now.
-- Returns 1 if the lease was ours and is released, 0 otherwise.
--@include entry lease indices staging hinted

return hinted(function()
  local owner = lock_parts()
  if owner == nil or owner == ARGV[6] then
    for i = 7, #ARGV do
      local _, raw = find(D, ARGV[i])
      if raw and is_done((split(raw))) then redis.call('LREM', D, 1, raw) end
    end
  end
  if owner ~= ARGV[6] then
    HINT[8] = 1  -- perhaps a replay of our own release: report the indices again
    if #ARGV > 6 and owner == nil then reindex() end
    return 0
  end
  redis.call('DEL', LOCK)
  reindex_and_wake()
  return 1
end)
