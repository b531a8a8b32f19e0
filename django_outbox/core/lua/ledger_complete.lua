#!lua
-- ledger_complete: an error entry the ledger probe confirms delivered -> staged as
-- delivered with its entry_delivered owed, which the next claim of the session (a
-- worker, woken now) fires: never lost (docs/explanation/lifecycle.md, "The ledger
-- probe"). Counted as a ledger confirmation ('vl') in the per-minute history; its ending,
-- delivered, is recorded for the pages (lib/endings.lua).
-- ARGV[6] entry ID  ARGV[7] the attempts it had when the probe was asked (anything
-- else: busy, it moved meanwhile)  ARGV[8] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'removed' | 'not_found' | 'busy', version, count, watched, the entry as it was}.
--@include entry time users staging operator endings hinted
local id, attempts, history_ttl = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])

return hinted(function()
  local _, raw = find(Q, id)
  if not raw then return unchanged_reply('not_found') end
  local st, content = split(raw)
  if st.status ~= 'error' or (st.attempts or 0) ~= attempts then
    return unchanged_reply('busy')
  end
  redis.call('LREM', Q, 1, raw)
  st.deliveredAt = iso(NOW)
  uncount(st)
  redis.call('RPUSH', D, join(st, content))
  record_ending(id, 'delivered')
  count_history('vl', 1, history_ttl)
  return changed_reply('removed', 1, {raw})
end)
