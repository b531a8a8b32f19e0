#!lua flags=allow-oom
-- recover: return the session's staged entries whose lease is gone to its queue
-- as verifying (the interrupted attempt's outcome is unknown; see recover_staged
-- in lib/staging.lua). A live lease is never taken: then nothing changes.
-- No script-specific KEYS or ARGV.
-- Returns {'ok', version, count, watched, recovered entries...}.
--@include lease staging operator hinted

return hinted(function()
  if lock_parts() then return unchanged_reply('ok') end
  local had = redis.call('LLEN', D)
  local changed = recover_staged()
  if had > 0 and #changed == 0 then reindex_and_wake() end
  return changed_reply('ok', #changed, changed)
end)
