#!lua flags=allow-oom
-- settle_next: record a delivery, then claim the session's next entry under the same
-- lease, as one transition (docs/explanation/lifecycle.md). Used by a
-- worker whose entry_delivered nobody listens to: there is no signal to fire between
-- the two, so the acknowledgement may follow the settle at once.
-- ARGV[6..18] as settle.lua (ARGV[8] 'delivered', ARGV[9] the agent's reference)
-- ARGV[19] lease TTL (ms)
-- ARGV[20..] IDs of delivered entries to acknowledge, the settled one among them
-- The settled entry, acknowledged here, leaves staging at once, and the claim starts
-- from the lease and the staging list the settle saw: three commands fewer than the
-- two scripts one after the other.
-- Returns the settle's reply when it recorded nothing ('lost', 'gone'), else
-- {'next', the settle's reply, the claim's reply} (lib/settle.lua, lib/claim.lua).
-- Replay-safe as both are: a replay finds the delivery recorded ('replayed') and the
-- next entry staged under the lease.
--@include settle claim hinted
if ARGV[8] ~= 'delivered' then error({err = 'outbox: this script only records delivered'}) end
local policy = settle_policy(10)
local token, id = ARGV[6], ARGV[7]
local acknowledge = argv_from(20)
local acknowledged = false
for _, ack in ipairs(acknowledge) do
  if ack == id then acknowledged = true end
end
return hinted(function()
  local settled, carried = settle(token, id, 'delivered', ARGV[9], policy, acknowledged)
  if settled[1] ~= 'removed' and not (settled[1] == 'replayed' and settled[2] == 'removed') then
    return settled
  end
  return {'next', settled, claim(token, tonumber(ARGV[19]), acknowledge, carried)}
end)
