-- operator: the common reply of the operator transitions (retry.lua, dismiss.lua,
-- park.lua, unpark.lua, unpause.lua, rearm_unverifiable.lua, ledger_complete.lua,
-- ledger_rearm.lua) and of recover.lua.
--@include layout entry lease indices staging history

-- {result, version, count, watched, changed entries...}. Reindexes, wakes a worker and
-- bumps the version only if an entry changed.
local function changed_reply(result, count, changed)
  local v
  if #changed > 0 then
    reindex_and_wake()
    v = bump()
  else
    v = current_version()
  end
  local out = {result, v, count, watched()}
  for _, c in ipairs(changed) do out[#out + 1] = c end
  return out
end

-- The reply of an operator's change: it reaches the per-minute history as 'x' (after
-- one, the depth sample walks the sessions again; history_ttl in ms, 0: not counted),
-- then changed_reply.
local function operator_reply(result, count, changed, history_ttl)
  if #changed > 0 then
    count_history('x', #changed, history_ttl)
  end
  return changed_reply(result, count, changed)
end

-- The reply of a transition that changed nothing: {result, version, 0, 0}.
local function unchanged_reply(result)
  return {result, current_version(), 0, 0}
end

-- Edit every entry of the queue and the staging list that edit(st, key) changes (it
-- returns true then; key is Q or D); delivered entries whose signal is owed are left
-- alone. Returns the changed entries as stored now.
local function edit_entries(edit)
  local changed = {}
  for _, key in ipairs({Q, D}) do
    local items = redis.call('LRANGE', key, 0, -1)
    for i, raw in ipairs(items) do
      local st, content = split(raw)
      if not is_done(st) and edit(st, key) then
        local new = join(st, content)
        redis.call('LSET', key, i - 1, new)
        changed[#changed + 1] = new
      end
    end
  end
  return changed
end

-- Where the entry an operator names stands, for retry and dismiss: 'staged' and its raw
-- JSON (left in staging by a holder that is gone: its outcome is unknown), or 'queued',
-- its raw JSON and its index in the queue; else nil and the reply: not_found (absent,
-- or delivered with only its signal owed) or busy (staged under a live lease, or the
-- entry the lease is held for).
local function locate(id)
  local owner, _, lock_entry = lock_parts()
  local _, staged = find(D, id)
  if staged and is_done((split(staged))) then return nil, unchanged_reply('not_found') end
  if staged then
    if owner then return nil, unchanged_reply('busy') end
    return 'staged', staged
  end
  local idx, raw = find(Q, id)
  if not raw then return nil, unchanged_reply('not_found') end
  if owner and lock_entry == id then return nil, unchanged_reply('busy') end
  return 'queued', raw, idx
end
