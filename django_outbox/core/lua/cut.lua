#!lua
-- cut: mark the turn of the session's entry in flight as cut (lib/cut.lua says how;
-- docs/howto/cutting.md). The settle of a cut entry is verified, never guessed
-- (lib/settle.lua): delivered keeps interrupted; a proven absence removes it as cancelled.
-- ARGV[6] entry ID or '' (the one in flight)  ARGV[7] the signal key's TTL (ms)
-- ARGV[8] the entry a Stop names or '' (with ARGV[6] ''): cut the turn in flight only
-- while it is that entry's  ARGV[9] the actor (django_outbox/core/actors.py): stoppedBy
-- KEYS[EXTRA] the session's cut signal
-- Returns {'cut' | 'already' | 'idle' | 'queued' | 'not_found' | 'not_in_flight',
-- version, count, watched, entry as stored now (cut, already)}: 'already' (cut before;
-- the signal is set again), 'idle' (nothing in flight), 'queued' (the named entry is
-- queued and was never sent: nothing to cut), 'not_found' (the named entry is not there,
-- or delivered), 'not_in_flight' (ARGV[8]'s entry is not the one in flight: nothing cut).
--@include entry lease operator cut hinted
local id, signal_ttl, named, actor = ARGV[6], tonumber(ARGV[7]), ARGV[8], ARGV[9]

return hinted(function()
  local result, raw = cut_turn(id, KEYS[EXTRA], signal_ttl, named, actor)
  if result == nil then return unchanged_reply(raw) end
  if result == 'already' then
    local out = unchanged_reply('already')
    out[5] = raw
    return out
  end
  return changed_reply('cut', 1, {raw})
end)
