#!lua flags=allow-oom
-- renew: extend many leases in one round trip (docs/explanation/lifecycle.md).
-- ARGV[1] G: 1 when KEYS[1] is the global workspaces-due ZSET (standalone), else 0
-- ARGV[2] now (us)  ARGV[3..5] unused  ARGV[6] lease TTL (ms)
-- KEYS[G+1..]: pairs (lock, due) per lease; the session layout (lib/layout.lua) is not used.
-- ARGV[7..]: triples (token, session ID, workspace ID), one per KEYS pair.
-- A lease is extended only while it still holds the caller's token; the
-- session's due score moves to the new expiry so no worker looks at it early.
-- Returns a list of 1 (renewed) / 0 (lost), in order.
--@include now
local G = tonumber(ARGV[1])
local ttl = tonumber(ARGV[6])
local global = G > 0 and KEYS[1] or nil
local first = G + 1
local out = {}
for i = first, #KEYS, 2 do
  local lock, due = KEYS[i], KEYS[i + 1]
  local j = 7 + ((i - first) / 2) * 3
  local token, ses, ws = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local v = redis.call('GET', lock)
  if v and string.match(v, '^(%S+)') == token then
    redis.call('PEXPIRE', lock, ttl)
    redis.call('ZADD', due, NOW_MS + ttl, ses)
    if global then
      local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
      redis.call('ZADD', global, head[2], ws)
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
