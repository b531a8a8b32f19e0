-- settle: record the outcome of the holder's delivery or verification, then release
-- the lease (docs/explanation/lifecycle.md, "What happens to a message").
--@include layout entry time lease indices users staging endings

local function backoff(base, cap, n)
  local delay = base * (2 ^ (n - 1))
  if delay > cap then delay = cap end
  return delay
end

-- The retry and verification tunables and the receipt's TTL, read from ARGV[i..i+8]:
-- MAX_ATTEMPTS, RETRY_BACKOFF (us), MAX_BACKOFF (us), MAX_TRANSIENT_FAILURES,
-- VERIFY_DELAY (us), VERIFY_BACKOFF (us), MAX_VERIFY_BACKOFF (us), MAX_VERIFY_ATTEMPTS,
-- the settle receipt's TTL (ms) (core/scripts.py settle_argv).
local function settle_policy(i)
  return {
    max_attempts = tonumber(ARGV[i]), retry_backoff = tonumber(ARGV[i + 1]),
    max_backoff = tonumber(ARGV[i + 2]), max_transient = tonumber(ARGV[i + 3]),
    verify_delay = tonumber(ARGV[i + 4]), verify_backoff = tonumber(ARGV[i + 5]),
    max_verify_backoff = tonumber(ARGV[i + 6]), max_verify_attempts = tonumber(ARGV[i + 7]),
    receipt_ttl = tonumber(ARGV[i + 8]),
  }
end

-- The outcomes that prove an entry never reached the agent: a cut entry (interrupted)
-- that ends so is removed as cancelled instead of being sent again.
local CANCELS_A_CUT = {failed = true, absent = true, transient = true, prior_pending = true,
                       held = true}

-- The state `st` (a table, changed in place) takes after `outcome` (not 'delivered'):
-- counters, status, reason, gate and lastError (`err`, '' keeps it).
local function apply_outcome(st, outcome, err, policy)
  local next_status, reason, next_at = nil, nil, nil
  local holds, held_since = st.holds, st.heldSince
  st.holds, st.heldSince = nil, nil  -- holds count only while they follow one another
  if outcome == 'held' then
    -- Due again at the agent's time, but never sooner than a floor that doubles with each
    -- hold in a row (a Retry-After of 0, a past date or garbage never makes a request
    -- storm), and never later than HOLD_MAX; no attempt used. Held HOLD_MAX_TOTAL since
    -- the first hold of the run: given up (docs/howto/agents.md#held-retry-after).
    if not policy.hold_total then error({err = 'outbox: held needs the hold arguments'}) end
    st.holds = (holds or 0) + 1
    st.heldSince = held_since or iso(NOW)
    if NOW - parse_iso(st.heldSince) >= policy.hold_total then
      next_status, reason = 'error', 'hold_exhausted'
      st.heldSince = nil
    else
      local hold = policy.hold
      local floor = backoff(policy.hold_floor, policy.hold_max, st.holds)
      if hold < floor then hold = floor end
      if hold > policy.hold_max then hold = policy.hold_max end
      next_status, next_at = 'pending', NOW + hold
    end
  elseif outcome == 'failed' or outcome == 'absent' then
    st.attempts = (st.attempts or 0) + 1
    if st.attempts >= policy.max_attempts then
      next_status, reason = 'error', 'max_attempts'
    else
      next_status, next_at = 'pending', NOW + backoff(policy.retry_backoff, policy.max_backoff, st.attempts)
    end
  elseif outcome == 'transient' or outcome == 'prior_pending' then
    st.transientFails = (st.transientFails or 0) + 1
    if st.transientFails >= policy.max_transient then
      next_status, reason = 'error', 'transient_exhausted'
    else
      next_status, next_at = 'pending', NOW + backoff(policy.retry_backoff, policy.max_backoff, st.transientFails)
    end
  elseif outcome == 'ambiguous' then
    st.verifyAttempts = 0
    next_status, next_at = 'verifying', NOW + policy.verify_delay
  elseif outcome == 'inconclusive' then
    st.verifyAttempts = (st.verifyAttempts or 0) + 1
    if st.verifyAttempts >= policy.max_verify_attempts then
      next_status, reason = 'error', 'unverifiable'
    else
      next_status, next_at = 'verifying', NOW + backoff(policy.verify_backoff, policy.max_verify_backoff, st.verifyAttempts)
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
  -- Proven not delivered: a merged group is over (its members may merge again). Unknown:
  -- the group is verified as one, through its first entry's message.
  if outcome ~= 'ambiguous' and outcome ~= 'inconclusive' and outcome ~= 'unverifiable' then
    st.mergedInto = nil
  end
end

-- The members delivered with entry `id` in one merged message, found in `items` (the
-- list the head is in, as read: D while staged, Q while verified) and not delivered:
-- {index (0-based), raw, state, content} each, in list order
-- (docs/howto/steering.md#merging).
local function members_of(id, items)
  local out = {}
  for i, raw in ipairs(items) do
    local st, content = split(raw)
    if st.mergedInto == id and st.id ~= id and not is_done(st) then
      out[#out + 1] = {i - 1, raw, st, content}
    end
  end
  return out
end

-- Record `outcome` (delivered | failed | absent | transient | prior_pending | held |
-- ambiguous | inconclusive | unverifiable) of the delivery of entry `id` under the lease `token`;
-- `err` is the error text ('' keeps lastError; for 'delivered', the agent's reference to the
-- delivery, stored as agentRef), `policy` what settle_policy returns;
-- 'held' (the agent asked to be left alone until a time: docs/howto/agents.md) also
-- reads policy.hold (us, the agent's Retry-After), policy.hold_floor, policy.hold_max and
-- policy.hold_total (us), which settle.lua adds.
-- acknowledged: the caller acknowledges a delivered entry's signal in the same script
-- (settle_next.lua), so it leaves staging at once.
-- Returns the reply, and (only when a delivery was recorded with `acknowledged`) what
-- the claim that follows may start from: {owner = token, staging = the staging list
-- as it is now}. Replies:
-- {'removed', entry, version, watched, members...} (members: the other entries of a
-- merged message, delivered with it) (delivered: the entry leaves the queue but stays
-- in staging marked deliveredAt, the lease still held, until the caller has fired
-- entry_delivered and acknowledged it with release.lua; if the caller dies first, the
-- next claim fires the owed signal), {'updated', entry, version, watched},
-- {'cancelled', entry as it was, version, watched, members...} (a cut entry proven absent:
-- removed, with the other entries of its merged message),
-- {'replayed', 'removed'|'updated'|'cancelled'} (this settle already ran, reply lost),
-- {'lost'} (the lease is not ours: touch nothing, the outcome is left to verification)
-- or {'gone'}. 'removed' and 'cancelled' record how the entry and its members ended
-- (lib/endings.lua).
local function settle(token, id, outcome, err, policy, acknowledged)
  local receipt = token .. ' ' .. id
  local owner = lock_parts()
  if owner ~= token then
    local r = redis.call('GET', RECEIPT)
    if r and string.sub(r, 1, #receipt + 1) == receipt .. ' ' then
      HINT[8] = 1  -- report the indices again (see lib/layout.lua)
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
  local queued = nil
  if not raw then
    where = Q
    idx, raw, _, queued = find(Q, id)
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

  -- Only the head of a merged message marks itself (lib/claim.lua): others read nothing more.
  local members = {}
  if st.mergedInto == id then members = members_of(id, where == D and staging or queued) end
  if outcome == 'delivered' then
    st.deliveredAt = iso(NOW)
    -- For 'delivered', `err` is the agent's reference to the delivery (compact JSON of an
    -- object of strings, checked by core/rules.py agent_ref_json; '' none): agentRef.
    if err ~= '' then st.agentRef = cjson.decode(err) end
    uncount(st)  -- delivered: no longer queued for its user, though its signal may be owed
    local done = join(st, content)
    local carried = nil
    -- A merged message's members are delivered with it: each stays staged marked
    -- delivered, its entry_delivered owed (fired by the next claim, lib/claim.lua).
    local delivered_members = {}
    for _, m in ipairs(members) do
      m[3].deliveredAt = iso(NOW)
      m[3].agentRef = st.agentRef  -- delivered in the same message: the same reference
      uncount(m[3])
      local mdone = join(m[3], m[4])
      delivered_members[#delivered_members + 1] = mdone
      if where == D then
        redis.call('LSET', D, m[1], mdone)
      else
        redis.call('LREM', Q, 1, m[2])
        redis.call('RPUSH', D, mdone)
      end
    end
    if where == D and acknowledged then  -- settle_next.lua: acknowledged in this script
      redis.call('LREM', D, 1, raw)
      if #members > 0 then
        staging = redis.call('LRANGE', D, 0, -1)
      else
        table.remove(staging, idx + 1)
      end
      carried = {owner = token, staging = staging}
    elseif where == D then
      redis.call('LSET', D, idx, done)
    else
      redis.call('LREM', Q, 1, raw)
      redis.call('RPUSH', D, done)
    end
    redis.call('SET', RECEIPT, receipt .. ' removed', 'PX', policy.receipt_ttl)
    record_ending(id, 'delivered')
    for _, m in ipairs(members) do record_ending(m[3].id, 'delivered') end
    -- An LSET in staging changes nothing the indices look at (the queue, the staging
    -- list's length, the lease, still held): they are exact as the claim left them.
    -- (Acknowledged, the staging list shrinks; settle_next.lua's claim reindexes before
    -- the script ends.)
    if where == Q then reindex() end
    local out = {'removed', done, bump(), watched()}
    for _, m in ipairs(delivered_members) do out[#out + 1] = m end
    return out, carried
  end

  if st.interrupted == true and CANCELS_A_CUT[outcome] then
    -- A cut entry that provably never reached the agent is never sent again: it
    -- leaves as cancelled (docs/howto/cutting.md), and so do the other entries of its
    -- merged message, which went with it (docs/howto/steering.md#merging).
    redis.call('LREM', where, 1, raw)
    uncount(st)
    local out = {'cancelled', raw, 0, 0}
    for _, m in ipairs(members) do
      redis.call('LREM', where, 1, m[2])
      uncount(m[3])
      out[#out + 1] = m[2]
    end
    redis.call('DEL', LOCK)
    redis.call('SET', RECEIPT, receipt .. ' cancelled', 'PX', policy.receipt_ttl)
    record_ending(id, 'cancelled')
    for _, m in ipairs(members) do record_ending(m[3].id, 'cancelled') end
    reindex()
    out[3], out[4] = bump(), watched()
    return out
  end

  apply_outcome(st, outcome, err, policy)

  local new = join(st, content)
  if where == D then
    local pivot = pivot_for(st)  -- every read before the first write
    redis.call('LREM', D, 1, raw)
    insert_before(pivot, new)
  else
    redis.call('LSET', Q, idx, new)
  end
  -- A merged message's members take the same outcome, each with its own counters, and
  -- go back in accept order behind it.
  local changed = {}
  for _, m in ipairs(members) do
    apply_outcome(m[3], outcome, err, policy)
    local mnew = join(m[3], m[4])
    if where == D then
      local mpivot = pivot_for(m[3])
      redis.call('LREM', D, 1, m[2])
      insert_before(mpivot, mnew)
    else
      redis.call('LSET', Q, m[1], mnew)
    end
    changed[#changed + 1] = mnew
  end
  redis.call('DEL', LOCK)
  redis.call('SET', RECEIPT, receipt .. ' updated', 'PX', policy.receipt_ttl)
  reindex()
  local out = {'updated', new, bump(), watched()}
  for _, c in ipairs(changed) do out[#out + 1] = c end
  return out
end
