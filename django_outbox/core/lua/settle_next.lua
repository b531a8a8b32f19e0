-- settle_next: record a delivery, then claim the session's next entry under the same
-- lease, in one script (README "The worker"): settle.lua with the outcome 'delivered',
-- then claim.lua acknowledging the settled entry, as one transition. Used by a worker
-- whose entry_delivered nobody listens to: there is no signal to fire between the two,
-- so the acknowledgement may follow the settle at once.
-- ARGV[6..18] as settle.lua (ARGV[8] 'delivered')  ARGV[19] lease TTL (ms)
-- ARGV[20..] IDs of delivered entries to acknowledge, the settled one among them
--            (claim.lua's ARGV[8..])
-- The settled entry, acknowledged here, leaves staging at once, and the claim half
-- starts from the lease and the staging list the settle half saw (ACK_SETTLED and
-- CARRIED in _lib.lua): three commands fewer than the two scripts one after the other.
-- Returns settle.lua's reply when it recorded nothing ('lost', 'gone'), else
-- {'next', settle.lua's reply, claim.lua's reply}. Replay-safe as both are: a replay
-- finds the delivery recorded ('replayed') and the next entry staged under the lease.
ONLY_OP = 'delivered'
local function settle_step()
--@settle
end
local function claim_step()
--@claim
end
local given = {}
for i = 1, #ARGV do given[i] = ARGV[i] end
for i = 20, #ARGV do
  if ARGV[i] == ARGV[7] then ACK_SETTLED = true end
end
local settled = settle_step()
if settled[1] ~= 'removed' and not (settled[1] == 'replayed' and settled[2] == 'removed') then
  return settled
end
-- claim.lua's ARGV, rewritten in place (the table itself cannot be replaced): the
-- lease token stays at 6, the lease TTL goes to 7, the IDs to acknowledge follow.
local n = 7
ARGV[7] = given[19]
for i = 20, #given do
  n = n + 1
  ARGV[n] = given[i]
end
for i = #given, n + 1, -1 do ARGV[i] = nil end
return {'next', settled, claim_step()}
