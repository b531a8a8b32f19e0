-- settle: record the outcome of the holder's delivery or verification, then
-- release the lease (README "What happens to a message": the outcome table).
-- ARGV[6] lease token  ARGV[7] entry ID  ARGV[8] outcome: delivered | failed |
--   absent | transient | prior_pending | ambiguous | inconclusive | unverifiable
-- ARGV[9] error text ('' keeps lastError)  ARGV[10] MAX_ATTEMPTS
-- ARGV[11] RETRY_BACKOFF (us)  ARGV[12] MAX_BACKOFF (us)  ARGV[13] MAX_TRANSIENT_FAILURES
-- ARGV[14] VERIFY_DELAY (us)  ARGV[15] VERIFY_BACKOFF (us)  ARGV[16] MAX_VERIFY_BACKOFF (us)
-- ARGV[17] MAX_VERIFY_ATTEMPTS  ARGV[18] receipt TTL (ms)
-- Returns {'removed', entry, version, watched} (delivered: the entry leaves the queue
-- but stays in staging marked deliveredAt, the lease still held, until the
-- caller has fired entry_delivered and acknowledged it with release.lua; if the
-- caller dies first, the next claim fires the owed signal),
-- {'updated', entry, version, watched}, {'replayed', 'removed'|'updated'} (this settle
-- already ran and its reply was lost), {'lost'} (the lease is not ours: touch
-- nothing, the outcome is left to verification) or {'gone'}.
local token, id, outcome, err = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
if ONLY_OP and outcome ~= ONLY_OP then error({err = 'outbox: this script only records ' .. ONLY_OP}) end
local max_attempts, retry_backoff, max_backoff = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local max_transient, verify_delay = tonumber(ARGV[13]), tonumber(ARGV[14])
local verify_backoff, max_verify_backoff = tonumber(ARGV[15]), tonumber(ARGV[16])
local max_verify_attempts, receipt_ttl = tonumber(ARGV[17]), tonumber(ARGV[18])
local receipt = token .. ' ' .. id

local owner = lock_parts()
if owner ~= token then
  local r = redis.call('GET', RECEIPT)
  if r and string.sub(r, 1, #receipt + 1) == receipt .. ' ' then
    HINT[8] = 1  -- report the indices again (see _lib.lua)
    return {'replayed', string.sub(r, #receipt + 2)}
  end
  return {'lost'}
end

local where = D
local idx, raw, _, staging = find(D, id)
if raw and is_done((split(raw))) then
  HINT[8] = 1
  return {'replayed', 'removed'}  -- already settled as delivered; its signal is owed
end
if not raw then
  where = Q
  idx, raw = find(Q, id)
end
if not raw then
  -- Recorded by this very holder and acknowledged since (settle_next.lua does both in
  -- one script): a replay after a lost reply, which must not touch the lease.
  local r = redis.call('GET', RECEIPT)
  if r and string.sub(r, 1, #receipt + 1) == receipt .. ' ' then
    HINT[8] = 1
    return {'replayed', string.sub(r, #receipt + 2)}
  end
  redis.call('DEL', LOCK)
  reindex()
  return {'gone'}
end
local st, content = split(raw)

if outcome == 'delivered' then
  st.deliveredAt = iso(NOW)
  uncount(st)  -- delivered: no longer queued for its user, though its signal may be owed
  local done = join(st, content)
  if where == D and ACK_SETTLED then  -- settle_next.lua: acknowledged in this script
    redis.call('LREM', D, 1, raw)
    table.remove(staging, idx + 1)
    CARRIED = {owner = token, staging = staging}
  elseif where == D then
    redis.call('LSET', D, idx, done)
  else
    redis.call('LREM', Q, 1, raw)
    redis.call('RPUSH', D, done)
  end
  redis.call('SET', RECEIPT, receipt .. ' removed', 'PX', receipt_ttl)
  -- An LSET in staging changes nothing the indices look at (the queue, the staging
  -- list's length, the lease, still held): they are exact as the claim left them.
  -- (With ACK_SETTLED the staging list shrinks; settle_next.lua's claim half
  -- reindexes before the script ends.)
  if where == Q then reindex() end
  return {'removed', done, bump(), watched()}
end

local next_status, reason, next_at = nil, nil, nil
if outcome == 'failed' or outcome == 'absent' then
  st.attempts = (st.attempts or 0) + 1
  if st.attempts >= max_attempts then
    next_status, reason = 'error', 'max_attempts'
  else
    next_status, next_at = 'pending', NOW + backoff(retry_backoff, max_backoff, st.attempts)
  end
elseif outcome == 'transient' or outcome == 'prior_pending' then
  st.transientFails = (st.transientFails or 0) + 1
  if st.transientFails >= max_transient then
    next_status, reason = 'error', 'transient_exhausted'
  else
    next_status, next_at = 'pending', NOW + backoff(retry_backoff, max_backoff, st.transientFails)
  end
elseif outcome == 'ambiguous' then
  st.verifyAttempts = 0
  next_status, next_at = 'verifying', NOW + verify_delay
elseif outcome == 'inconclusive' then
  st.verifyAttempts = (st.verifyAttempts or 0) + 1
  if st.verifyAttempts >= max_verify_attempts then
    next_status, reason = 'error', 'unverifiable'
  else
    next_status, next_at = 'verifying', NOW + backoff(verify_backoff, max_verify_backoff, st.verifyAttempts)
  end
elseif outcome == 'unverifiable' then
  next_status, reason = 'error', 'unverifiable'
else
  error({err = 'outbox: unknown outcome ' .. tostring(outcome)})
end

if err ~= '' then st.lastError = err end
if next_status == 'error' then
  st.status, st.reason, st.parkedFrom, st.nextAttemptAt = 'error', reason, nil, nil
elseif st.status == 'parked' then
  -- Parked while in flight: stay parked; unpark resumes from the new state.
  st.parkedFrom = next_status
  st.nextAttemptAt = nil
else
  st.status, st.reason = next_status, nil
  st.nextAttemptAt = next_at and iso(next_at) or nil
end

local new = join(st, content)
if where == D then
  local pivot = pivot_for(st)  -- every read before the first write
  redis.call('LREM', D, 1, raw)
  insert_before(pivot, new)
else
  redis.call('LSET', Q, idx, new)
end
redis.call('DEL', LOCK)
redis.call('SET', RECEIPT, receipt .. ' updated', 'PX', receipt_ttl)
reindex()
return {'updated', new, bump(), watched()}
