-- Move merged user messages into the history. With ARGV[3] == '1' and nothing to move, close the
-- inbox (the turn is finishing), atomically with the check.
-- KEYS: state, inbox, history, trimmed. ARGV: attempt, history TTL s, closing ('1' or '0'), max messages.
-- Returns the moved messages, or false when fenced off.
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return false end
local msgs = redis.call('LRANGE', KEYS[2], 0, -1)
if #msgs > 0 then
  redis.call('RPUSH', KEYS[3], unpack(msgs))
  redis.call('EXPIRE', KEYS[3], ARGV[2])
  trim(KEYS[3], KEYS[4], ARGV[4], ARGV[2])
  redis.call('DEL', KEYS[2])
elseif ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'inbox_closed', '1')
end
return msgs
