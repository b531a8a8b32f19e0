-- snapshot: everything list() needs, read at one instant.
-- Returns {version, queue entries, staged entries, lock value or false, lock PTTL (ms),
-- now (us, the server's clock: how long the lease has been held is judged on it)}.
return {
  current_version(),
  redis.call('LRANGE', Q, 0, -1),
  redis.call('LRANGE', D, 0, -1),
  redis.call('GET', LOCK),
  redis.call('PTTL', LOCK),
  NOW,
}
