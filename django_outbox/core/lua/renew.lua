-- renew: extend many leases in one round trip (DESIGN section 6).
-- KEYS: pairs (lock, due) per lease; the session layout of _lib.lua is not used.
-- ARGV[1] 0  ARGV[2] now (us)  ARGV[3..5] unused  ARGV[6] lease TTL (ms)
-- ARGV[7..] pairs (token, session ID), one per KEYS pair.
-- A lease is extended only while it still holds the caller's token; the
-- session's due score moves to the new expiry so no worker looks at it early.
-- Returns a list of 1 (renewed) / 0 (lost), in order.
local ttl = tonumber(ARGV[6])
local out = {}
for i = 1, #KEYS, 2 do
  local lock, due = KEYS[i], KEYS[i + 1]
  local j = 7 + (i - 1)
  local token, ses = ARGV[j], ARGV[j + 1]
  local v = redis.call('GET', lock)
  if v and string.match(v, '^(%S+)') == token then
    redis.call('PEXPIRE', lock, ttl)
    redis.call('ZADD', due, NOW_MS + ttl, ses)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
