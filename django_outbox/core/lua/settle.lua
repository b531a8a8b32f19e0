#!lua
-- settle: record the outcome of the holder's delivery or verification, then release
-- the lease (lib/settle.lua says how).
-- ARGV[6] lease token  ARGV[7] entry ID  ARGV[8] outcome: delivered | failed |
--   absent | transient | prior_pending | ambiguous | inconclusive | unverifiable
-- ARGV[9] error text ('' keeps lastError; for 'delivered': the agent's reference, compact
--   JSON, '' none)  ARGV[10] MAX_ATTEMPTS
-- ARGV[11] RETRY_BACKOFF (us)  ARGV[12] MAX_BACKOFF (us)  ARGV[13] MAX_TRANSIENT_FAILURES
-- ARGV[14] VERIFY_DELAY (us)  ARGV[15] VERIFY_BACKOFF (us)  ARGV[16] MAX_VERIFY_BACKOFF (us)
-- ARGV[17] MAX_VERIFY_ATTEMPTS  ARGV[18] receipt TTL (ms)
-- ARGV[19] for 'held': the agent's hold (us)  ARGV[20] HOLD_FLOOR (us)  ARGV[21] HOLD_MAX (us)
-- ARGV[22] HOLD_MAX_TOTAL (us)
-- Returns lib/settle.lua's reply.
--@include settle hinted
local policy = settle_policy(10)
policy.hold, policy.hold_floor = tonumber(ARGV[19]), tonumber(ARGV[20])
policy.hold_max, policy.hold_total = tonumber(ARGV[21]), tonumber(ARGV[22])
return hinted(function()
  return (settle(ARGV[6], ARGV[7], ARGV[8], ARGV[9], policy, false))
end)
