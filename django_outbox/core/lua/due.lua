#!lua flags=no-writes
-- due: the members of one due-time ZSET whose time has come, on the server's clock
-- (one clock for every process: docs/explanation/ordering.md). A worker's scan reads the
-- workspaces-due index with it, then each due workspace's sessions; recovery reads
-- a workspace's due sessions.
-- KEYS[1] a ZSET: member -> due time (ms)
-- ARGV[1] now (us); 0: the server's clock (TIME)  ARGV[2] most members to return
-- ARGV[3] '1': with their scores
-- Returns {member, ...}, or {member, score, member, score, ...}.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit = tonumber(ARGV[2])
local max = math.floor(now / 1000)
if ARGV[3] == '1' then
  return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', max, 'WITHSCORES', 'LIMIT', 0, limit)
end
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', max, 'LIMIT', 0, limit)
