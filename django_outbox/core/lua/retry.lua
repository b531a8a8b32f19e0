#!lua
-- retry: re-arm one entry now (docs/explanation/lifecycle.md, "What retry does"):
-- error -> pending (unverifiable -> verifying when a verifier exists), expired ->
-- pending without its expiry (the operator asked for it now), counters of
-- transient failures and verification passes restarted; pending/verifying -> due now.
-- After a definitive failure the revision (the request's idempotency key) moves on.
-- A staged entry whose holder is gone is recovered as verifying. An entry staged under
-- a live lease, the entry the lease is held for, or a parked entry is busy.
-- ARGV[6] entry ID  ARGV[7] '1': a verifier exists  ARGV[8] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'updated' | 'not_found' | 'busy', version, count, watched, changed entries...}.
--@include entry staging operator hinted
local id, has_verifier, history_ttl = ARGV[6], ARGV[7], tonumber(ARGV[8])

return hinted(function()
  local where, raw, idx = locate(id)
  if where == nil then return raw end  -- the reply: not_found or busy
  if where == 'staged' then
    -- Staged by a holder that is gone: recovered as verifying, its outcome unknown.
    return operator_reply('updated', 1, recover_staged(), history_ttl)
  end
  local st, content = split(raw)
  if st.status == 'parked' then return unchanged_reply('busy') end
  -- After a definitive failure (or an absent verdict) the agent holds no request of this
  -- revision, and one that cached its refusal per key would replay it: the operator's retry
  -- sends a new request, under a new key (docs/howto/agents.md#the-idempotency-key). An
  -- outcome still unknown (verifying, unverifiable) keeps the key its verification asks with.
  if (st.attempts or 0) > 0 and (st.status == 'pending'
      or (st.status == 'error' and st.reason ~= 'unverifiable')) then
    st.revision = (st.revision or 0) + 1
  end
  if st.status == 'expired' then
    st.status, st.expiresAt = 'pending', nil
  elseif st.status == 'error' then
    if st.reason == 'unverifiable' and has_verifier == '1' then
      st.status = 'verifying'
    else
      st.status = 'pending'
    end
    st.reason = nil
    st.transientFails = 0
    st.verifyAttempts = 0
  end
  st.holds = nil
  st.nextAttemptAt = nil
  local new = join(st, content)
  redis.call('LSET', Q, idx, new)
  return operator_reply('updated', 1, {new}, history_ttl)
end)
