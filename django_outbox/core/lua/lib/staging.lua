-- staging: finding entries, putting one back in accept order, and recovering the
-- staging list a holder that is gone left behind.
--@include layout entry

-- Staged entries whose signal is owed, as raw JSON. staged: the staging list
-- as the caller read it (LRANGE D), or nil to read it here.
local function owed_signals(staged)
  local owed = {}
  for _, raw in ipairs(staged or redis.call('LRANGE', D, 0, -1)) do
    if is_done((split(raw))) then owed[#owed + 1] = raw end
  end
  return owed
end

-- Find an entry by ID in a list: index (0-based), raw, the list's length and the
-- list as read; or nil, nil, the list's length and the list.
local function find(key, id)
  local prefix = id_prefix(id)
  local items = redis.call('LRANGE', key, 0, -1)
  for i, raw in ipairs(items) do
    if string.sub(raw, 1, #prefix) == prefix then return i - 1, raw, #items, items end
  end
  return nil, nil, #items, items
end

-- Accept order: the per-session sequence number accept.lua gives every entry
-- (the session's version at that moment). Clocks are not compared: two web
-- servers' clocks may disagree, and equal timestamps would tie.
local function later(a, b)
  local sa, sb = a.seq, b.seq
  if sa ~= nil and sa ~= cjson.null and sb ~= nil and sb ~= cjson.null then return sa > sb end
  return a.acceptedAt > b.acceptedAt
end

-- The queued entry (raw) that an entry with state st goes back in front of,
-- or nil for the tail. Read-only: call it before any write of the transition.
local function pivot_for(st)
  for _, other in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    if later((split(other)), st) then return other end
  end
  return nil
end

local function insert_before(pivot, raw)
  if pivot then
    redis.call('LINSERT', Q, 'BEFORE', pivot, raw)
  else
    redis.call('RPUSH', Q, raw)
  end
end

-- Move staged entries left by a holder that is gone back into the queue as
-- verifying: the interrupted attempt's outcome is unknown. An entry already in
-- the queue (same ID) is not added twice. Returns the moved entries. staged: the
-- staging list as the caller read it (LRANGE D), or nil to read it here.
local function recover_staged(staged)
  local moved = {}
  staged = staged or redis.call('LRANGE', D, 0, -1)
  if #staged == 0 then return moved end  -- no staging list: nothing to move or delete
  local keep = {}
  for _, raw in ipairs(staged) do
    local st, content = split(raw)
    if is_done(st) then
      keep[#keep + 1] = raw  -- delivered; only its signal is owed (see lib/claim.lua)
    elseif not find(Q, st.id) then
      if st.status == 'parked' then
        st.parkedFrom = 'verifying'
      else
        st.status = 'verifying'
      end
      st.verifyAttempts = 0
      st.nextAttemptAt = nil
      local new = join(st, content)
      insert_before(pivot_for(st), new)
      moved[#moved + 1] = new
    end
  end
  redis.call('DEL', D)
  if #keep > 0 then redis.call('RPUSH', D, unpack(keep)) end
  return moved
end
