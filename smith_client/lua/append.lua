-- Append whole messages to the history, fenced. KEYS: state, history. ARGV: attempt, history TTL s,
-- messages JSON... Returns the history length, or -1 when fenced off.
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
local n = redis.call('RPUSH', KEYS[2], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[2], ARGV[2])
return n
