#!lua
-- send_now: make a queued prompt the session's next and cut the running turn
-- (docs/howto/cutting.md). The prompt moves in front of the first pending entry of the
-- queue: entries whose outcome is unknown (verifying, such as the cut one) stay ahead of
-- it, so the cut turn is verified before the prompt is sent. The turn is cut as cut.lua
-- cuts it (lib/cut.lua).
-- ARGV[6] entry ID  ARGV[7] the signal key's TTL (ms)  KEYS[EXTRA] the session's cut signal
-- ARGV[8] the actor (django_outbox/core/actors.py): the moved prompt's movedBy and the cut
-- entry's stoppedBy  ARGV[9] the entry whose turn may be cut, or '' (whichever runs): the
-- turn in flight is cut only while it is that entry's, else the prompt moves and nothing is
-- cut ('moved')
-- Returns {result, version, count, watched, changed entries...}: 'cut' (moved, and the
-- turn in flight is cut), 'already' (moved; that turn was cut before), 'moved' (moved;
-- nothing was in flight), 'busy' (the entry is in flight, being verified, in error or
-- parked: it is not a queued prompt), 'not_found'. changed: the moved entry (its event
-- state is "moved"), then the cut entry (cut only).
--@include entry lease staging operator cut hinted
local id, signal_ttl, actor, cut_only = ARGV[6], tonumber(ARGV[7]), ARGV[8], ARGV[9]

return hinted(function()
  local idx, raw = find(Q, id)
  if raw == nil then
    local _, staged = find(D, id)
    return unchanged_reply(staged and not is_done((split(staged))) and 'busy' or 'not_found')
  end
  local st, content = split(raw)
  if st.status ~= 'pending' then return unchanged_reply('busy') end
  redis.call('LREM', Q, 1, raw)
  st.movedBy = actor
  raw = join(st, content)
  local pivot = nil
  for _, other in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    if split(other).status == 'pending' then pivot = other break end
  end
  insert_before(pivot, raw)
  local result, cut = cut_turn('', KEYS[EXTRA], signal_ttl, cut_only, actor)
  local changed = {raw}
  if result == 'cut' then changed[2] = cut end
  return changed_reply(result or 'moved', #changed, changed)
end)
