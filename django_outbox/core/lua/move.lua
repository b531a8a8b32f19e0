#!lua
-- move: put one queued entry elsewhere in its session's queue (docs/howto/steering.md#reorder):
-- 'next' (first after the entries held in place), 'last', or 'before' another queued entry.
-- The entry in flight or being verified never moves, and nothing moves ahead of it.
-- ARGV[6] entry ID  ARGV[7] 'next' | 'last' | 'before'  ARGV[8] the entry to go before
-- ('' unless 'before')  ARGV[9] HISTORY_WINDOW (ms; 0: not counted)
-- ARGV[10] the actor (django_outbox/core/actors.py), recorded as movedBy on a move made
-- Returns {'moved' | 'not_found' | 'busy', version, count, watched, moved entry}; 'moved'
-- with no entry when it already stood there (nothing written).
--@include entry staging operator steering hinted
local id, where_to, before_id, history_ttl = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
local actor = ARGV[10]

-- The entry as it goes to its new place: raw with movedBy set.
local function moved(raw)
  local st, content = split(raw)
  st.movedBy = actor
  return join(st, content)
end

return hinted(function()
  local where, raw = locate(id)
  if where == nil then return raw end  -- the reply: not_found or busy
  if where == 'staged' then return unchanged_reply('busy') end
  local _, _, lock_entry = lock_parts()
  local items = redis.call('LRANGE', Q, 0, -1)
  -- floor: the last place (1-based) held by a pinned entry; nothing goes at or above it.
  local floor, at, target = 0, nil, nil
  for i, item in ipairs(items) do
    local st = split(item)
    if pinned(st, lock_entry) then floor = i end
    if item == raw then at = i end
    if where_to == 'before' and st.id == before_id then target = i end
  end
  if at <= floor then return unchanged_reply('busy') end
  if where_to == 'last' then
    if at == #items then return unchanged_reply('moved') end
    local new = moved(raw)
    redis.call('LREM', Q, 1, raw)
    redis.call('RPUSH', Q, new)
    return operator_reply('moved', 1, {new}, history_ttl)
  end
  if where_to == 'next' then
    target = floor + 1
  elseif target == nil then
    -- Not queued: the entry in flight (nothing goes ahead of it), or none.
    local _, staged = find(D, before_id)
    if staged and not is_done((split(staged))) then return unchanged_reply('busy') end
    return unchanged_reply('not_found')
  elseif target <= floor then
    return unchanged_reply('busy')
  end
  if target == at or target == at + 1 then return unchanged_reply('moved') end
  local new = moved(raw)
  redis.call('LREM', Q, 1, raw)
  redis.call('LINSERT', Q, 'BEFORE', items[target], new)
  return operator_reply('moved', 1, {new}, history_ttl)
end)
