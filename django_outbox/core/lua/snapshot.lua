-- snapshot: everything list() needs, read at one instant.
-- Returns {version, queue entries, staged entries, lock value or false, lock PTTL (ms)}.
return {
  tonumber(redis.call('GET', VER) or 0),
  redis.call('LRANGE', Q, 0, -1),
  redis.call('LRANGE', D, 0, -1),
  redis.call('GET', LOCK),
  redis.call('PTTL', LOCK),
}
