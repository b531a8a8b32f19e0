#!lua
-- unpark: parked entries of the session (with that reason, or any for '') -> the state
-- they were parked from; when the workspace is parked with that reason (or any, for
-- ''), the session is released from the pause in the same script, so an accept into
-- it is held until its earlier entries are back in line.
-- ARGV[6] reason or ''  ARGV[7] HISTORY_WINDOW (ms; 0: not counted)
-- Returns {'ok', version, count unparked, watched, unparked entries...}.
--@include operator hinted
local reason, history_ttl = ARGV[6], tonumber(ARGV[7])

return hinted(function()
  local changed = edit_entries(function(st, key)
    if st.status == 'parked' and (reason == '' or st.reason == reason) then
      st.status = st.parkedFrom or 'pending'
      st.parkedFrom, st.reason = nil, nil
      if key == Q then st.nextAttemptAt = nil end
      return true
    end
    return false
  end)
  local paused = redis.call('HGET', PAUSE, 'reason')
  if paused and (reason == '' or reason == paused) then
    redis.call('HSET', PAUSE, 'released:' .. SES, 1)
  end
  return operator_reply('ok', #changed, changed, history_ttl)
end)
