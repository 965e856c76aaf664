-- Append whole messages to the history, fenced, then trim it.
-- KEYS: state, history, trimmed. ARGV: attempt, the history end the attempt expects ('' = any), history
-- TTL s, max messages, messages... The expected end fences off an attempt whose earlier writes were lost
-- (Redis failed over to a replica that had not received them): it must not write after a history it
-- does not know, nor go on reading one (smith_worker/turn/attempt.py).
-- Returns the history's new absolute end, or -1 when fenced off.
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
if ARGV[2] ~= '' and history_end(KEYS[2], KEYS[3]) ~= tonumber(ARGV[2]) then return -1 end
redis.call('RPUSH', KEYS[2], unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[2], ARGV[3])
trim(KEYS[2], KEYS[3], ARGV[4], ARGV[3])
return history_end(KEYS[2], KEYS[3])
