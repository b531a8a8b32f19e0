-- operate: operator and sweep transitions of one session (README "The Python API").
-- ARGV[6] op, one of:
--   retry <id> <has_verifier>      error -> pending (unverifiable -> verifying when a
--                                  verifier exists); pending/verifying -> due now
--   dismiss <id>                   remove the entry
--   park <reason>                  pending/verifying/delivering -> parked
--   unpark <reason or ''>          parked (with that reason) -> the state it was parked from;
--                                  when the workspace is parked with that reason (or any,
--                                  for ''), the session is released from the pause too
--   unpause <reason or ''>         end the workspace's pause if every session is released
--                                  (result 'ok', count 1) or it is not paused with that
--                                  reason; count 0: a session is still held, unpark again
--   rearm_unverifiable             error/unverifiable -> verifying, fresh verify window
--   ledger_complete <id> <attempts> error entry confirmed delivered by the ledger -> removed
--                                  (its entry_delivered is owed; the next claim fires it)
--   ledger_rearm <id> <attempts>   error entry with no ledger row or a failed one -> pending
-- ARGV[7], ARGV[8]: the op's arguments as above. ARGV[9]: HISTORY_WINDOW (ms; 0 or
-- absent: nothing counted): park counts its entries as parked ('p'), ledger_complete
-- its confirmation ('vl'), in the per-minute history (README "Dashboard").
-- An entry staged with a live lease, or the entry the lease is held for, is busy.
-- Returns {result, version, count, watched, changed entries...}; result is 'updated',
-- 'removed', 'not_found', 'busy' or 'ok' (bulk ops; count says how many).
local op, arg1, arg2, history_ttl = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9] or 0)
if ONLY_OP and op ~= ONLY_OP then error({err = 'outbox: this script only runs ' .. ONLY_OP}) end
local owner, _, lock_entry = lock_parts()
local changed = {}

local version = current_version

local function finish(result, count)
  -- An operator's change reaches the history (after one, the depth sample walks the
  -- sessions again); parks and ledger confirmations are counted as such.
  if #changed > 0 and op ~= 'park' and op ~= 'ledger_complete' then
    count_history('x', #changed, history_ttl)
  end
  return changed_reply(result, count, changed)
end

if op == 'retry' or op == 'dismiss' then
  local idx, raw = find(D, arg1)
  if raw and is_done((split(raw))) then return {'not_found', version(), 0, 0} end
  if raw then
    if owner then return {'busy', version(), 0, 0} end
    -- Staged by a holder that is gone: its outcome is unknown.
    if op == 'dismiss' then
      redis.call('LREM', D, 1, raw)
      uncount((split(raw)))
      changed[1] = raw
      return finish('removed', 1)
    end
    changed = recover_staged()
    return finish('updated', 1)
  end
  idx, raw = find(Q, arg1)
  if not raw then return {'not_found', version(), 0, 0} end
  if owner and lock_entry == arg1 then return {'busy', version(), 0, 0} end
  local st, content = split(raw)
  if op == 'dismiss' then
    redis.call('LREM', Q, 1, raw)
    uncount(st)
    changed[1] = raw
    return finish('removed', 1)
  end
  if st.status == 'parked' then return {'busy', version(), 0, 0} end
  if st.status == 'error' then
    if st.reason == 'unverifiable' and arg2 == '1' then
      st.status = 'verifying'
    else
      st.status = 'pending'
    end
    st.reason = nil
    st.transientFails = 0
    st.verifyAttempts = 0
  end
  st.nextAttemptAt = nil
  local new = join(st, content)
  redis.call('LSET', Q, idx, new)
  changed[1] = new
  return finish('updated', 1)
end

if op == 'park' or op == 'unpark' or op == 'rearm_unverifiable' then
  for _, key in ipairs({Q, D}) do
    local items = redis.call('LRANGE', key, 0, -1)
    for i, raw in ipairs(items) do
      local st, content = split(raw)
      local hit = false
      if is_done(st) then
        hit = false  -- delivered; only its signal is owed
      elseif op == 'park' then
        if st.status == 'pending' or st.status == 'verifying' or st.status == 'delivering' then
          st.parkedFrom, st.status, st.reason = st.status, 'parked', arg1
          hit = true
        end
      elseif op == 'unpark' then
        if st.status == 'parked' and (arg1 == '' or st.reason == arg1) then
          st.status = st.parkedFrom or 'pending'
          st.parkedFrom, st.reason = nil, nil
          if key == Q then st.nextAttemptAt = nil end
          hit = true
        end
      elseif key == Q and st.status == 'error' and st.reason == 'unverifiable' then
        st.status, st.reason, st.verifyAttempts, st.nextAttemptAt = 'verifying', nil, 0, nil
        hit = true
      end
      if hit then
        local new = join(st, content)
        redis.call('LSET', key, i - 1, new)
        changed[#changed + 1] = new
      end
    end
  end
  if op == 'park' then count_history('p', #changed, history_ttl) end
  if op == 'unpark' then
    local reason = redis.call('HGET', PAUSE, 'reason')
    if reason and (arg1 == '' or arg1 == reason) then
      redis.call('HSET', PAUSE, 'released:' .. SES, 1)
    end
  end
  return finish('ok', #changed)
end

if op == 'unpause' then
  local reason = redis.call('HGET', PAUSE, 'reason')
  if not reason or (arg1 ~= '' and arg1 ~= reason) then return {'ok', version(), 1, 0} end
  for _, ses in ipairs(redis.call('SMEMBERS', SESSIONS)) do
    if redis.call('HEXISTS', PAUSE, 'released:' .. ses) == 0 then
      return {'ok', version(), 0, 0}
    end
  end
  redis.call('DEL', PAUSE)
  return {'ok', version(), 1, 0}
end

if op == 'ledger_complete' or op == 'ledger_rearm' then
  local idx, raw = find(Q, arg1)
  if not raw then return {'not_found', version(), 0, 0} end
  local st, content = split(raw)
  if st.status ~= 'error' or (st.attempts or 0) ~= tonumber(arg2) then
    return {'busy', version(), 0, 0}
  end
  if op == 'ledger_complete' then
    -- Confirmed delivered: staged as delivered with its signal owed, which the
    -- next claim of the session (a worker, woken now) fires (never lost).
    redis.call('LREM', Q, 1, raw)
    st.deliveredAt = iso(NOW)
    uncount(st)
    redis.call('RPUSH', D, join(st, content))
    count_history('vl', 1, history_ttl)
    changed[1] = raw
    return finish('removed', 1)
  end
  st.status, st.reason, st.nextAttemptAt, st.transientFails = 'pending', nil, nil, 0
  local new = join(st, content)
  redis.call('LSET', Q, idx, new)
  changed[1] = new
  return finish('updated', 1)
end

error({err = 'outbox: unknown operation ' .. tostring(op)})
