#!lua flags=no-writes
-- snapshot: everything list() needs, read at one instant.
-- ARGV[6] (optional) preview: when > 0, each entry's text is cut on the server to its
-- first ARGV[6] characters, so a page of previews never moves whole texts (README
-- "Admin"); the rest of each entry is as stored.
-- Returns {version, queue entries, staged entries, lock value or false, lock PTTL (ms),
-- now (us, the server's clock: how long the lease has been held is judged on it),
-- how recent entries ended (lib/endings.lua recent_endings: "<entry-id> <how> <ms>"
-- items, newest first)}.
--@include entry lease endings
local PREVIEW = tonumber(ARGV[6] or '0') or 0
local TEXT_MARK, MODEL_MARK, TRACE_MARK = ',"text":"', ',"model":', ',"traceparent":'

-- The text is a JSON string in the content members (after MARK): a quote inside it is
-- always escaped, so the first ',"text":"' and the first ',"model":' (or, with no model,
-- ',"traceparent":') after it are structural: what follows the text is kept as stored.
-- Characters are counted as JSON decodes them: an escape or a UTF-8 sequence is one.
local function preview(raw)
  local content = string.find(raw, MARK, 1, true)
  local t = content and string.find(raw, TEXT_MARK, content, true)
  if not t then
    return raw
  end
  local i = t + #TEXT_MARK
  for _ = 1, PREVIEW do
    local b = string.byte(raw, i)
    if b == nil or b == 34 then
      return raw  -- the closing quote: the text is no longer than the preview
    elseif b == 92 then
      i = i + ((string.byte(raw, i + 1) == 117) and 6 or 2)
    elseif b < 0x80 then
      i = i + 1
    elseif b >= 0xF0 then
      i = i + 4
    elseif b >= 0xE0 then
      i = i + 3
    else
      i = i + 2
    end
  end
  if string.byte(raw, i) == 34 then
    return raw
  end
  local m = string.find(raw, MODEL_MARK, i, true) or string.find(raw, TRACE_MARK, i, true)
  return string.sub(raw, 1, i - 1) .. '"' .. (m and string.sub(raw, m) or '}')
end

local queued = redis.call('LRANGE', Q, 0, -1)
local staged = redis.call('LRANGE', D, 0, -1)
if PREVIEW > 0 then
  for _, list in ipairs({queued, staged}) do
    for k, raw in ipairs(list) do
      list[k] = preview(raw)
    end
  end
end
return {
  current_version(),
  queued,
  staged,
  redis.call('GET', LOCK),
  redis.call('PTTL', LOCK),
  NOW,
  recent_endings(),
}
