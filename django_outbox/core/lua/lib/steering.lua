-- steering: what edit.lua, move.lua and cancel.lua share (docs/howto/steering.md).
--@include layout entry lease

-- Is a queued entry held where it is: being verified (its outcome is unknown, the agent
-- may have it), the entry the lease is held for, or parked from either of those? Such an
-- entry is never edited, moved, passed or cancelled as a queued prompt.
local function pinned(st, lock_entry)
  if st.status == 'verifying' or (lock_entry and lock_entry == st.id) then return true end
  return st.status == 'parked' and st.parkedFrom ~= nil and st.parkedFrom ~= 'pending'
end
