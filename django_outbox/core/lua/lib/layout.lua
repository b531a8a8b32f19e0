-- layout: the KEYS and ARGV every per-session script shares (included first).
--   KEYS[1] queue     LIST   FIFO of JSON entries
--   KEYS[2] staging   LIST   entries being delivered right now
--   KEYS[3] lock      STRING lease "<token> <acquired-ms> [<entry-id>]"
--   KEYS[4] version   STRING per-session mutation counter
--   KEYS[5] markers   ZSET   marker name -> marker expiry (ms)
--   KEYS[6] receipt   STRING "<token> <entry-id> <outcome>" of the last settle
--   KEYS[7] due       ZSET   of the workspace: session -> due time (ms)
--   KEYS[8] sessions  SET    of the workspace's sessions
--   KEYS[9] watch     STRING number of WebSocket clients watching the session
--   KEYS[10] attn     ZSET   of the workspace: session -> since (ms), the sessions that
--                     need an operator's eye (kept on a cluster only, see HINT below)
--   KEYS[11] pause    STRING of the workspace: the reason it is parked; while it exists
--                     every entry accepted into the workspace is held as parked
--   KEYS[12] users    HASH of the workspace: user digest -> "<n> <full-at>": n of the
--                     user's entries are queued or in flight (not yet delivered) in the
--                     workspace, and the user's accept bucket is full again at full-at
--                     (us; see accept.lua). An entry carries the digest in its state
--                     ("userDigest"), so each path that removes one counts it out in the
--                     same script (lib/users.lua uncount)
--   KEYS[13] ended    LIST   how the session's recent entries ended, newest first
--                     (lib/endings.lua)
--   KEYS[14..18]      (standalone servers only) global keys: workspaces-due ZSET,
--                     workspaces SET, wake LIST ("<ws> <ses>" items workers BLMPOP),
--                     all-sessions ZSET ("<ws> <ses>" -> first accept, ms) and
--                     attention ZSET ("<ws> <ses>" -> since, ms: sessions holding
--                     error, parked or verifying entries, or pending ones blocked
--                     behind a lease, or staging without a lease) for the admin
-- and this ARGV prefix:
--   ARGV[1] number of global keys passed (0 on a cluster, 5 otherwise)
--   ARGV[2] now, microseconds since the epoch; 0: the server's clock (lib/now.lua)
--   ARGV[3] session ID   ARGV[4] workspace ID   ARGV[5] ordering: "strict" or "due"
-- Script-specific KEYS start at EXTRA, script-specific ARGV at 6.
--
-- On a cluster (G = 0) a script cannot touch the global indices: they live in
-- other slots. It records in HINT what it would have written there instead, and
-- lib/hinted.lua wraps its reply as {reply, HINT}; the client then applies HINT to
-- the workspace's shard with index.lua (see that script for the rules that keep the
-- shard right whatever order hints arrive in).
--@include now

local Q, D, LOCK, VER, MARKERS, RECEIPT, DUE, SESSIONS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local WATCH, WS_ATTENTION, PAUSE, USERS, ENDED = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local G = tonumber(ARGV[1])
local WSDUE, WORKSPACES, WAKE, ALL_SESSIONS, ATTENTION = KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local EXTRA = 14 + G
-- Cluster only: what the global indices need, reported to the client.
--   [1] the workspace's earliest due time (ms) when it moved earlier, else -1
--   [2] 1: wake a worker for this session   [3] attention: 1 in, 0 out, -1 unchanged
--   [4] 1: the session is new (or a replay: re-add it)   [5] 1: the session was deleted
--   [6] 1: the workspace has no session left   [7] the session's version
--   [8] 1: a replay, report the due time even if it did not move (a crashed
--       client may never have applied the first report)
local HINT = {-1, 0, -1, 0, 0, 0, 0, 0}
local SES, WS, ORDERING = ARGV[3], ARGV[4], ARGV[5]
local MEMBER = (WS or '') .. ' ' .. (SES or '')
