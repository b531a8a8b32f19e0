-- cut: mark the turn of a session's entry in flight as cut (docs/howto/cutting.md), for
-- cut.lua and send_now.lua. The mark is the entry's own state member interrupted = true
-- (durable with the entry: a dead holder's staging recovery keeps it, and so does a
-- server restart); the signal key holds the entry's ID for a lease's TTL so that the
-- lease holder, wherever it runs, notices within its cut poll and calls the aborter.
--@include layout entry

-- Is a queued entry's outcome unknown (verifying, or parked from verifying: a
-- workspace paused during its verification), so that its turn may still run?
local function unknown_outcome(st)
  return st.status == 'verifying' or (st.status == 'parked' and st.parkedFrom == 'verifying')
end

-- The entry in flight: id names one ('' = the one staged and not yet delivered, else
-- the first entry of the queue whose outcome is unknown, whose turn may still run).
-- Returns its list (D or Q), index and raw JSON; or nil and why not: 'idle' (nothing in
-- flight), 'queued' (the named entry is queued and was never sent) or 'not_found'.
local function in_flight(id)
  for i, raw in ipairs(redis.call('LRANGE', D, 0, -1)) do
    local st = split(raw)
    if not is_done(st) and (id == '' or st.id == id) then return D, i - 1, raw end
  end
  for i, raw in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    local st = split(raw)
    if id ~= '' and st.id == id then
      if unknown_outcome(st) then return Q, i - 1, raw end
      return nil, 'queued'
    end
    if id == '' and unknown_outcome(st) then return Q, i - 1, raw end
  end
  return nil, id == '' and 'idle' or 'not_found'
end

-- Cut the turn of the entry in flight (see in_flight). named (nil or '': none) is the
-- entry a Stop names, the one its client showed in flight: the turn is cut only while
-- that entry is the one in flight (id must be '' then), else nothing is cut and the
-- reason is 'not_in_flight' (it was delivered, is gone or waits in the queue, or another
-- entry is in flight: a Stop that arrives as the turn it aimed at ends never cuts the
-- next one). Read and cut in this one script, so no turn can start in between.
-- actor (django_outbox/core/actors.py) is recorded as the entry's stoppedBy when it cuts
-- (a turn cut before keeps who cut it first).
-- Returns 'cut' and the entry as stored now, 'already' (cut before: the signal is set
-- again) and the entry, or nil and the reason ('not_in_flight', or in_flight's).
local function cut_turn(id, signal, signal_ttl, named, actor)
  local key, idx, raw = in_flight(id)
  local st, content
  if key ~= nil then st, content = split(raw) end
  if named ~= nil and named ~= '' and (key == nil or st.id ~= named) then
    return nil, 'not_in_flight'
  end
  if key == nil then return nil, idx end
  redis.call('SET', signal, st.id, 'PX', signal_ttl)
  if st.interrupted == true then return 'already', raw end
  st.interrupted = true
  st.stoppedBy = actor
  -- Being verified after a backoff: due now, so its turn is aborted without waiting.
  if key == Q and st.status == 'verifying' then st.nextAttemptAt = nil end
  local new = join(st, content)
  redis.call('LSET', key, idx, new)
  return 'cut', new
end
