#!lua
-- edit: replace the content (text, model) of one entry that waits: pending, parked from
-- pending, expired or error (docs/howto/steering.md#edit). The state members are kept but
-- the revision, counted up when the content changes (the request's idempotency key);
-- the dedupe marker is left as it is, so a resend of the original request still answers
-- duplicate with this entry's ID. Compare-and-set on the content the caller read, so two
-- edits never lose one another silently.
-- ARGV[6] entry ID  ARGV[7] the session version the caller saw ('': any)
-- ARGV[8] the content as the caller read it (from ',"clientMessageID":' to the end)
-- ARGV[9] the new content  ARGV[10] HISTORY_WINDOW (ms; 0: not counted)
-- ARGV[11] the actor (django_outbox/core/actors.py), recorded as editedBy
-- Returns {'updated' | 'not_found' | 'busy' | 'version_mismatch' | 'changed' (the content
-- is not what the caller read: read again), version, count, watched, edited entry}.
--@include entry staging operator steering hinted
local id, if_version, seen, content_new = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local history_ttl, actor = tonumber(ARGV[10]), ARGV[11]

return hinted(function()
  local where, raw, idx = locate(id)
  if where == nil then return raw end  -- the reply: not_found or busy
  if where == 'staged' then return unchanged_reply('busy') end
  if if_version ~= '' and tonumber(if_version) ~= current_version() then
    return unchanged_reply('version_mismatch')
  end
  local _, _, lock_entry = lock_parts()
  local st, content = split(raw)
  if pinned(st, lock_entry) then return unchanged_reply('busy') end
  if content ~= seen then return unchanged_reply('changed') end
  -- Another request from now on: its idempotency key changes with the revision, so an
  -- agent that cached its answer to the old one never replays it
  -- (docs/howto/agents.md#the-idempotency-key)
  if content_new ~= content then st.revision = (st.revision or 0) + 1 end
  st.editedBy = actor
  local new = join(st, content_new)
  redis.call('LSET', Q, idx, new)
  return operator_reply('updated', 1, {new}, history_ttl)
end)
