-- Wraps a per-session transition (scripts.HINTED) so that, on a cluster (G = 0),
-- its reply carries the index hint (see HINT in _lib.lua). DUE_BEFORE and the due
-- time after compare the workspace's earliest due time: only a move earlier needs
-- the shard told (a shard's score may only ever be early). core/scripts.py puts
-- the transition's body where the line "--@transition" stands.
local DUE_BEFORE = G == 0 and earliest_due() or nil
local function transition()
--@transition
end
local reply = transition()
if G ~= 0 then return reply end
local due_after = earliest_due()
if due_after ~= nil and (HINT[8] == 1 or DUE_BEFORE == nil or due_after < DUE_BEFORE) then
  HINT[1] = due_after
end
HINT[7] = current_version()
if reply == nil then reply = false end
return {reply, HINT}
