#!lua flags=allow-oom
-- claim: take the session's lease and its next piece of work (lib/claim.lua says how).
-- ARGV[6] lease token  ARGV[7] lease TTL (ms)
-- ARGV[8..] IDs of delivered entries whose entry_delivered the caller fired
--           under this same lease (acknowledged first; see release.lua)
-- Returns lib/claim.lua's reply.
--@include claim hinted
return hinted(function()
  return claim(ARGV[6], tonumber(ARGV[7]), argv_from(8), nil)
end)
