-- entry: the stored entry's codec. Entries are edited without re-encoding client
-- content: split() cuts the state members off at the first structural
-- ',"clientMessageID":' and join() re-encodes only the state, in a fixed member order
-- (cjson would damage client JSON: empty arrays, large integers).
local MARK = ',"clientMessageID":'
local ORDER = {'id', 'status', 'reason', 'parkedFrom', 'attempts', 'verifyAttempts',
               'transientFails', 'holds', 'acceptedAt', 'seq', 'lastAttemptAt', 'nextAttemptAt',
               'lastError', 'deliveredAt', 'expiresAt', 'mode', 'mergedInto', 'userDigest'}
-- interrupted: the turn of this entry was cut (docs/howto/cutting.md); kept before
-- userDigest, which stays last.
table.insert(ORDER, #ORDER, 'interrupted')
-- heldSince: when the current run of holds began; revision: how often the request changed
-- (its idempotency key, docs/howto/agents.md#the-idempotency-key). Before userDigest too.
table.insert(ORDER, #ORDER, 'heldSince')
table.insert(ORDER, #ORDER, 'revision')
-- agentRef: the agent's reference to a delivery (a small object of strings, set by the
-- delivered settle: lib/settle.lua). Before userDigest too.
table.insert(ORDER, #ORDER, 'agentRef')
-- editedBy, movedBy, cancelledBy, stoppedBy: who last made that change (an actor,
-- django_outbox/core/actors.py), written by the script of the change. Before userDigest.
for _, k in ipairs({'editedBy', 'movedBy', 'cancelledBy', 'stoppedBy'}) do
  table.insert(ORDER, #ORDER, k)
end
local ZERO_OMITTED = {verifyAttempts = true, transientFails = true, holds = true, revision = true}

local function split(raw)
  local i = string.find(raw, MARK, 1, true)
  if not i then
    error({err = 'outbox: malformed entry (no clientMessageID member)'})
  end
  return cjson.decode(string.sub(raw, 1, i - 1) .. '}'), string.sub(raw, i)
end

-- cjson writes numbers with 14 significant digits: 1796041140804470 would come
-- back as 1.7960411408045e+15. Integers (seq is a session version, microseconds
-- large) are written exactly.
local function encode_value(v)
  if type(v) == 'number' and v == math.floor(v) and math.abs(v) < 2 ^ 53 then
    return string.format('%.0f', v)
  end
  return cjson.encode(v)
end

local function join(st, content)
  local parts = {}
  for _, k in ipairs(ORDER) do
    local v = st[k]
    if v ~= nil and v ~= cjson.null and not (ZERO_OMITTED[k] and v == 0) then
      parts[#parts + 1] = '"' .. k .. '":' .. encode_value(v)
    end
  end
  return '{' .. table.concat(parts, ',') .. content
end

local function id_prefix(id)
  return '{"id":' .. cjson.encode(id) .. ','
end

-- A staged entry whose delivery is confirmed but whose entry_delivered
-- receivers have not been acknowledged yet: the signal is still owed.
local function is_done(st)
  return st.deliveredAt ~= nil and st.deliveredAt ~= cjson.null
end
