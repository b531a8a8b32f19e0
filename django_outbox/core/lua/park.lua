#!lua
-- park: pending, verifying and delivering entries of the session -> parked with a
-- reason (docs/explanation/lifecycle.md, "Parking a workspace"); counted as parked
-- ('p') in the per-minute history.
-- ARGV[6] reason  ARGV[7] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'ok', version, count parked, watched, parked entries...}.
--@include operator hinted
local reason, history_ttl = ARGV[6], tonumber(ARGV[7])

return hinted(function()
  local changed = edit_entries(function(st)
    if st.status == 'pending' or st.status == 'verifying' or st.status == 'delivering' then
      st.parkedFrom, st.status, st.reason = st.status, 'parked', reason
      return true
    end
    return false
  end)
  count_history('p', #changed, history_ttl)
  return changed_reply('ok', #changed, changed)
end)
