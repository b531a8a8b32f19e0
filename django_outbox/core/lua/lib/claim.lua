-- claim: take the session's lease and its next piece of work
-- (docs/explanation/lifecycle.md, "What happens to a message").
--@include layout entry time lease indices staging reclaim endings

-- Has a pending entry passed its expiresAt (server clock)? Then it is never sent
-- (docs/howto/steering.md#expiry). Entries being verified may already be with the agent:
-- they never expire.
local function expired_now(st)
  local at = st.expiresAt
  return st.status == 'pending' and at ~= nil and at ~= cjson.null and parse_iso(at) <= NOW
end

-- The run of merge prompts directly behind a merge head at idx (0-based) of items: pending,
-- mode 'merge', due and not expired, up to the first entry that is not
-- (docs/howto/steering.md#merging). Returns their indices (0-based), in queue order.
local function merge_run(items, idx)
  local run = {}
  for i = idx + 2, #items do
    local st = split(items[i])
    if st.status ~= 'pending' or st.mode ~= 'merge' or expired_now(st) then break end
    local due = gate(st)
    if due == nil or due > NOW then break end
    run[#run + 1] = i - 1
  end
  return run
end

-- Claim under lease `token` for `ttl` ms, first acknowledging `acknowledge` (a list of
-- IDs of delivered entries whose entry_delivered the caller fired under this same
-- lease; see release.lua). carried: nil, or what a settle in the same script has just
-- read ({owner = the lease token, staging = the staging list as it is now}; see
-- lib/settle.lua), so that nothing is read twice. Returns one of:
--   {'busy', pttl}                another holder's lease stands
--   {'idle', false, version, watched}        nothing due (the lease is not kept)
--   {'deliver', entry, version, watched}     the entry was staged as delivering
--   {'verify', entry, version, watched}      the head awaits verification
--   {'owed', false, version, watched, entries...}  delivered entries whose entry_delivered
--                                 was never acknowledged (their holder died):
--                                 fire it, then acknowledge with release.lua
-- deliver/verify/idle answers are followed by the JSON of entries recovered
-- from a dead holder's staging (now verifying) and of the entries this claim found
-- past their expiresAt (now expired; each ending is recorded, lib/endings.lua).
-- Replay-safe: a holder that calls again gets its staged entry back.
local function claim(token, ttl, acknowledge, carried)
  local owner = carried and carried.owner or lock_parts()

  if owner and owner ~= token then
    reindex()
    return {'busy', redis.call('PTTL', LOCK)}
  end

  -- The staging list, read once (or as the settle in the same script left it): the
  -- acknowledgements, the owed signals, the carried entry and the recovery below all
  -- work on this copy, kept equal to D.
  local staged_items = carried and carried.staging or redis.call('LRANGE', D, 0, -1)
  if owner == nil or owner == token then
    for _, id in ipairs(acknowledge) do
      local prefix = id_prefix(id)
      for j, raw in ipairs(staged_items) do
        if string.sub(raw, 1, #prefix) == prefix then
          if is_done((split(raw))) then
            redis.call('LREM', D, 1, raw)
            table.remove(staged_items, j)
          end
          break
        end
      end
    end
  end

  local owed = owed_signals(staged_items)
  if #owed > 0 then
    redis.call('SET', LOCK, token .. ' ' .. NOW_MS, 'PX', ttl)
    reindex()
    local out = {'owed', false, current_version(), watched()}
    for _, r in ipairs(owed) do out[#out + 1] = r end
    return out
  end

  local recovered = {}
  if owner == token then
    local staged = staged_items[1]
    if staged then
      redis.call('PEXPIRE', LOCK, ttl)
      -- A merged delivery staged its members behind the head: they come back too.
      local out = {'deliver', staged, current_version(), watched()}
      for i = 2, #staged_items do out[#out + 1] = staged_items[i] end
      return out
    end
  else
    recovered = recover_staged(staged_items)
  end

  local function answer(kind, entry, version)
    local out = {kind, entry, version, watched()}
    for _, r in ipairs(recovered) do out[#out + 1] = r end
    return out
  end

  local items = redis.call('LRANGE', Q, 0, -1)
  -- Staging is empty from here on: an entry staged under our lease answered 'deliver'
  -- above, owed ones 'owed', and a recovery empties it. After a recovery reindex reads it
  -- all the same (rare); otherwise it is given what this script knows.
  local staged_now = #recovered == 0 and 0 or nil
  local idx, raw, st, content = find_head(items)
  -- A head past its expiry ends expired here, in the script that would have handed it
  -- over, so no claim in the same millisecond can send it; the next one is looked at.
  while idx ~= nil and expired_now(st) do
    st.status, st.nextAttemptAt = 'expired', nil
    record_ending(st.id, 'expired')
    local new = join(st, content)
    redis.call('LSET', Q, idx, new)
    items[idx + 1] = new
    recovered[#recovered + 1] = new
    idx, raw, st, content = find_head(items)
  end
  if idx == nil then
    if owner == token then redis.call('DEL', LOCK) end
    local empty_at = nil
    if #items == 0 and #recovered == 0 then
      -- Empty: reclaimed once its dedupe window has passed (lib/reclaim.lua).
      empty_at = reclaim_at()
      if empty_at <= NOW_MS then
        reclaim()
        return answer('idle', false, current_version())
      end
    end
    reindex(items, staged_now, -2, empty_at)  -- no lease now
    local version = #recovered > 0 and bump() or current_version()
    return answer('idle', false, version)
  end

  if st.status == 'verifying' then
    redis.call('SET', LOCK, token .. ' ' .. NOW_MS .. ' ' .. st.id, 'PX', ttl)
    reindex(items, staged_now, ttl)
    local version = #recovered > 0 and bump() or current_version()
    return answer('verify', raw, version)
  end

  -- A merge head takes the merge prompts directly behind it into the same delivery: each
  -- is staged after it, marked with its ID (docs/howto/steering.md#merging).
  local members = {}
  if st.mode == 'merge' then
    for _, j in ipairs(merge_run(items, idx)) do
      local mst, mcontent = split(items[j + 1])
      mst.status, mst.lastAttemptAt, mst.nextAttemptAt = 'delivering', iso(NOW), nil
      mst.mergedInto = st.id
      members[#members + 1] = {items[j + 1], join(mst, mcontent)}
    end
    if #members > 0 then st.mergedInto = st.id end
  end
  st.status = 'delivering'
  st.lastAttemptAt = iso(NOW)
  st.nextAttemptAt = nil
  local staged = join(st, content)
  redis.call('LREM', Q, 1, raw)
  redis.call('RPUSH', D, staged)
  for _, m in ipairs(members) do
    redis.call('LREM', Q, 1, m[1])
    redis.call('RPUSH', D, m[2])
  end
  for k = #members, 0, -1 do table.remove(items, idx + 1 + k) end  -- the queue as it is now
  redis.call('SET', LOCK, token .. ' ' .. NOW_MS .. ' ' .. st.id, 'PX', ttl)
  -- The staging list held nothing before (a staged or owed entry answers above, and a
  -- recovery empties it): it holds this delivery's entries now, under a lease of ttl ms.
  reindex(items, 1 + #members, ttl)
  local out = answer('deliver', staged, bump())
  for _, m in ipairs(members) do out[#out + 1] = m[2] end
  return out
end

-- ARGV[from..] as a list (the IDs to acknowledge).
local function argv_from(from)
  local out = {}
  for i = from, #ARGV do out[#out + 1] = ARGV[i] end
  return out
end
