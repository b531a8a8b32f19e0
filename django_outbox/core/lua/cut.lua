#!lua
-- cut: mark the turn of the session's entry in flight as cut (docs/howto/cutting.md).
-- The mark is the entry's own state member interrupted = true (durable with the entry:
-- it survives a dead holder, whose staging recovery keeps it, and a server restart);
-- the signal key (KEYS[EXTRA]) holds the entry's ID for LOCK_TTL so that the lease
-- holder, wherever it runs, notices within its cut poll and calls the aborter. Which
-- entry: ARGV[6] names one ('' = the one in flight: staged and not yet delivered, else
-- the first verifying entry of the queue, whose turn may still run).
-- The settle of a cut entry is verified, never guessed (lib/settle.lua): delivered keeps
-- interrupted; a proven or verified absence removes it as cancelled.
-- ARGV[6] entry ID or ''  ARGV[7] the signal key's TTL (ms)
-- Returns {'cut' | 'already' | 'idle' | 'queued' | 'not_found', version, count, watched,
-- entry as stored now}: 'already' (cut before; the signal is set again), 'idle' (nothing
-- in flight), 'queued' (the named entry is queued and was never sent: nothing to cut),
-- 'not_found' (the named entry is not there, or delivered with its signal owed).
--@include entry lease staging operator hinted
local id, signal_ttl = ARGV[6], tonumber(ARGV[7])
local SIGNAL = KEYS[EXTRA]

local function in_flight()
  for i, raw in ipairs(redis.call('LRANGE', D, 0, -1)) do
    local st = split(raw)
    if not is_done(st) and (id == '' or st.id == id) then return D, i - 1, raw end
  end
  for i, raw in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    local st = split(raw)
    if id ~= '' and st.id == id then
      if st.status == 'verifying' or (st.status == 'parked' and st.parkedFrom == 'verifying') then
        return Q, i - 1, raw
      end
      return nil, 'queued'
    end
    if id == '' and st.status == 'verifying' then return Q, i - 1, raw end
  end
  return nil, id == '' and 'idle' or 'not_found'
end

return hinted(function()
  local key, idx, raw = in_flight()
  if key == nil then return unchanged_reply(idx) end
  local st, content = split(raw)
  redis.call('SET', SIGNAL, st.id, 'PX', signal_ttl)
  if st.interrupted == true then
    local out = unchanged_reply('already')
    out[5] = raw
    return out
  end
  st.interrupted = true
  local new = join(st, content)
  redis.call('LSET', key, idx, new)
  return changed_reply('cut', 1, {new})
end)
