#!lua
-- ledger_rearm: an error entry with no ledger row, or a failed one -> pending, due now
-- (docs/explanation/lifecycle.md, "The ledger probe").
-- ARGV[6] entry ID  ARGV[7] the attempts it had when the probe was asked (anything
-- else: busy, it moved meanwhile)  ARGV[8] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'updated' | 'not_found' | 'busy', version, count, watched, re-armed entry}.
--@include entry staging operator hinted
local id, attempts, history_ttl = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])

return hinted(function()
  local idx, raw = find(Q, id)
  if not raw then return unchanged_reply('not_found') end
  local st, content = split(raw)
  if st.status ~= 'error' or (st.attempts or 0) ~= attempts then
    return unchanged_reply('busy')
  end
  st.status, st.reason, st.nextAttemptAt, st.transientFails = 'pending', nil, nil, 0
  local new = join(st, content)
  redis.call('LSET', Q, idx, new)
  return operator_reply('updated', 1, {new}, history_ttl)
end)
