#!lua
-- sockets: one user's open outbox WebSockets, counted across server processes on the
-- server's clock (docs/reference/websocket.md). Each socket is a member scored by
-- its expiry; a socket whose server died without closing it expires on its own.
-- KEYS[1] a ZSET: socket ID -> expiry (ms)
-- ARGV[1] 'open' or 'refresh'   ARGV[2] socket ID   ARGV[3] time to live (ms)
-- ARGV[4] (open) the most live sockets the user may hold; 0: no bound
-- Returns 1: counted (or refreshed); 0: refused, the user already holds ARGV[4] sockets.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[1] == 'open' then
  local limit = tonumber(ARGV[4])
  if limit > 0 and not redis.call('ZSCORE', KEYS[1], ARGV[2])
      and redis.call('ZCARD', KEYS[1]) >= limit then
    return 0
  end
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
-- Every member shares one time to live, so the newest expiry is this one.
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
