-- Append whole messages to the history, fenced, then trim it.
-- KEYS: state, history, trimmed. ARGV: attempt, history TTL s, max messages, messages...
-- Returns the history length, or -1 when fenced off.
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
local n = redis.call('RPUSH', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ARGV[2])
trim(KEYS[2], KEYS[3], ARGV[3], ARGV[2])
return n
