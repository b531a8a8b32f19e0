-- hinted: run a per-session transition so that, on a cluster (G = 0), its reply
-- carries the index hint (HINT in lib/layout.lua): return hinted(transition).
-- The workspace's earliest due time before and after is compared: only a move
-- earlier needs the shard told (a shard's score may only ever be early).
-- core/scripts.py reads the replies of the scripts that include this as {reply, HINT}
-- on a cluster.
--@include layout lease indices

local function hinted(transition)
  local DUE_BEFORE = G == 0 and earliest_due() or nil
  local reply = transition()
  if G ~= 0 then return reply end
  local due_after = earliest_due()
  if due_after ~= nil and (HINT[8] == 1 or DUE_BEFORE == nil or due_after < DUE_BEFORE) then
    HINT[1] = due_after
  end
  HINT[7] = current_version()
  if reply == nil then reply = false end
  return {reply, HINT}
end
