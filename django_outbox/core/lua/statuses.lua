#!lua flags=no-writes
-- statuses: how many entries of the session hold each stored status, read without
-- their content (docs/howto/observe.md: the metrics gauge). split() decodes only the
-- state members, so no text leaves the server, nor is decoded on it.
-- KEYS, ARGV: the per-session layout (lib/layout.lua) (no script-specific ones).
-- Returns {status, count, status, count, ...}: queued and staged entries alike.
--@include layout entry
local counts, order = {}, {}
for _, key in ipairs({Q, D}) do
  for _, raw in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local status = split(raw).status
    if counts[status] == nil then
      counts[status] = 0
      order[#order + 1] = status
    end
    counts[status] = counts[status] + 1
  end
end
local out = {}
for _, status in ipairs(order) do
  out[#out + 1] = status
  out[#out + 1] = counts[status]
end
return out
