#!lua
-- unpause: end the workspace's pause if every session is released (count 1), or if it
-- is not paused with that reason (count 1); count 0: a session is still held, unpark
-- again (docs/explanation/lifecycle.md, "Parking a workspace").
-- ARGV[6] reason or '' (any)
-- Returns {'ok', version, count, 0}.
--@include lease hinted
local reason = ARGV[6]

return hinted(function()
  local paused = redis.call('HGET', PAUSE, 'reason')
  if not paused or (reason ~= '' and reason ~= paused) then return {'ok', current_version(), 1, 0} end
  for _, ses in ipairs(redis.call('SMEMBERS', SESSIONS)) do
    if redis.call('HEXISTS', PAUSE, 'released:' .. ses) == 0 then
      return {'ok', current_version(), 0, 0}
    end
  end
  redis.call('DEL', PAUSE)
  return {'ok', current_version(), 1, 0}
end)
