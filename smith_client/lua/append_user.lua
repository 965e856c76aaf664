-- Append a turn's user message once per turn id. KEYS: state, history. ARGV: attempt, message JSON,
-- history TTL s. Returns its index in the history, or -1 when fenced off.
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
local start = redis.call('HGET', KEYS[1], 'history_start')
if start then return tonumber(start) end
local n = redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'history_start', n - 1)
return n - 1
