-- release: give up the lease without an outcome (compare-and-delete; a
-- holder never deletes someone else's lease). Staged entries stay staged and
-- are recovered as verifying by the next claim.
-- ARGV[6] lease token. Returns 1 if released, 0 if the lease was not ours.
local owner = lock_parts()
if owner ~= ARGV[6] then return 0 end
redis.call('DEL', LOCK)
reindex_and_wake()
return 1
