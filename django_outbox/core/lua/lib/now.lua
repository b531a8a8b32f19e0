-- now: the transition's clock. ARGV[2] is now in microseconds since the epoch; 0 (what
-- every caller but a test with an injected clock passes) means the server's clock (TIME).
-- One clock for every process: docs/explanation/ordering.md.
local NOW = tonumber(ARGV[2])
if NOW == 0 then
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local NOW_MS = math.floor(NOW / 1000)
