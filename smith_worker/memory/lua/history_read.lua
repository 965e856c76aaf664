-- Read a conversation's messages by absolute position (smith_worker/memory/history.py).
-- KEYS: history, trimmed. ARGV: first position, end position ('' = the end), or a negative count
-- of messages from the end when ARGV[3] == 'tail'; ARGV[4]: the most bytes the items may sum to.
-- Returns {trimmed, length, first index, items}, or {trimmed, length, first index, false, their bytes}
-- when the items exceed ARGV[4]: the reader then gets none of them.
local base = tonumber(redis.call('GET', KEYS[2]) or '0')
local len = redis.call('LLEN', KEYS[1])
local first, last
if ARGV[3] == 'tail' then
  first = math.max(len - tonumber(ARGV[1]), 0)
  last = len - 1
else
  first = math.max(tonumber(ARGV[1]) - base, 0)
  last = (ARGV[2] == '' and len or tonumber(ARGV[2]) - base) - 1
end
if last < first then return {base, len, first, {}} end
local items = redis.call('LRANGE', KEYS[1], first, last)
local size, limit = 0, tonumber(ARGV[4])
for i = 1, #items do size = size + #items[i] end
if size > limit then return {base, len, first, false, size} end
return {base, len, first, items}
