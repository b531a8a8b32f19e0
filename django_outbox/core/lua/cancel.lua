#!lua flags=allow-oom
-- cancel: remove one queued prompt, as dismiss does (docs/howto/steering.md#cancel); its
-- dedupe marker stays. A prompt in flight or being verified is not removed: cancelling
-- it means cutting the agent's turn, and its outcome must be verified first. A removed
-- prompt's ending, cancelled, is recorded for the pages (lib/endings.lua).
-- ARGV[6] entry ID  ARGV[7] HISTORY_WINDOW (ms; 0: not counted)
-- ARGV[8] the actor (django_outbox/core/actors.py): the removed entry is reported with it
-- as cancelledBy (nothing of the entry is stored any more to hold it)
-- Returns {'removed' | 'not_found' | 'in_flight', version, count, watched, removed entry}.
--@include entry users operator steering endings hinted
local id, history_ttl, actor = ARGV[6], tonumber(ARGV[7]), ARGV[8]

return hinted(function()
  local where, raw = locate(id)
  if where == nil then
    if raw[1] == 'busy' then return unchanged_reply('in_flight') end
    return raw  -- not_found
  end
  if where == 'staged' then return unchanged_reply('in_flight') end
  local _, _, lock_entry = lock_parts()
  local st, content = split(raw)
  if pinned(st, lock_entry) then return unchanged_reply('in_flight') end
  redis.call('LREM', Q, 1, raw)
  uncount(st)
  record_ending(id, 'cancelled')
  count_history('k', 1, history_ttl)  -- a cancellation, apart from failures (core/history.py)
  st.cancelledBy = actor
  return operator_reply('removed', 1, {join(st, content)}, history_ttl)
end)
