#!lua
-- cut: mark the turn of the session's entry in flight as cut (lib/cut.lua says how;
-- docs/howto/cutting.md). The settle of a cut entry is verified, never guessed
-- (lib/settle.lua): delivered keeps interrupted; a proven absence removes it as cancelled.
-- ARGV[6] entry ID or '' (the one in flight)  ARGV[7] the signal key's TTL (ms)
-- KEYS[EXTRA] the session's cut signal
-- Returns {'cut' | 'already' | 'idle' | 'queued' | 'not_found', version, count, watched,
-- entry as stored now (cut, already)}: 'already' (cut before; the signal is set again),
-- 'idle' (nothing in flight), 'queued' (the named entry is queued and was never sent:
-- nothing to cut), 'not_found' (the named entry is not there, or delivered).
--@include entry lease operator cut hinted
local id, signal_ttl = ARGV[6], tonumber(ARGV[7])

return hinted(function()
  local result, raw = cut_turn(id, KEYS[EXTRA], signal_ttl)
  if result == nil then return unchanged_reply(raw) end
  if result == 'already' then
    local out = unchanged_reply('already')
    out[5] = raw
    return out
  end
  return changed_reply('cut', 1, {raw})
end)
