#!lua
-- rearm_unverifiable: the session's error entries that failed as unverifiable ->
-- verifying, with a fresh verification window (an agent that was unreachable is back).
-- ARGV[6] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'ok', version, count re-armed, watched, re-armed entries...}.
--@include operator hinted
local history_ttl = tonumber(ARGV[6])

return hinted(function()
  local changed = edit_entries(function(st, key)
    if key == Q and st.status == 'error' and st.reason == 'unverifiable' then
      st.status, st.reason, st.verifyAttempts, st.nextAttemptAt = 'verifying', nil, 0, nil
      return true
    end
    return false
  end)
  return operator_reply('ok', #changed, changed, history_ttl)
end)
