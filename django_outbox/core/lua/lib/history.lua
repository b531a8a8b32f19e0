-- history: the per-minute counts behind the dashboard (docs/howto/observe.md).
--@include layout

-- Add n to `field` of this minute's HASH of the workspace (in its slot: legal on a
-- cluster though not in KEYS) and, on a standalone server, of the total one; keys.py
-- KeySpace.history names the same keys (PAUSE is '<prefix>pause:{<ws>}'). The TTL (ms;
-- 0: history off) is set when a field is first written, so it costs one command per
-- key per event.
local function count_history(field, n, ttl_ms)
  if not ttl_ms or ttl_ms <= 0 or n <= 0 then return end
  local minute = math.floor(NOW / 60000000)
  local prefix = string.sub(PAUSE, 1, #PAUSE - #WS - 8)
  local hist = prefix .. 'hist:{' .. WS .. '}:' .. minute
  if redis.call('HINCRBY', hist, field, n) == n then redis.call('PEXPIRE', hist, ttl_ms) end
  if G > 0 then
    hist = prefix .. 'hist:' .. minute
    if redis.call('HINCRBY', hist, field, n) == n then redis.call('PEXPIRE', hist, ttl_ms) end
  end
end
