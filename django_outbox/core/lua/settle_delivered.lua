#!lua flags=allow-oom
-- settle_delivered: settle.lua for the outcome 'delivered' only. A recorded delivery
-- frees memory, so unlike settle.lua this one runs on a server at maxmemory.
-- ARGV: as settle.lua, ARGV[8] 'delivered' (anything else is refused), ARGV[9] the agent's
-- reference to the delivery (compact JSON, '' none), stored as the entry's agentRef.
-- Returns lib/settle.lua's reply.
--@include settle hinted
if ARGV[8] ~= 'delivered' then error({err = 'outbox: this script only records delivered'}) end
local policy = settle_policy(10)
return hinted(function()
  return (settle(ARGV[6], ARGV[7], 'delivered', ARGV[9], policy, false))
end)
