-- Append a turn's user message once per turn id (smith_worker/turn/attempt.py).
-- KEYS: state, history, trimmed. ARGV: attempt, message, history TTL s, max messages, then optionally
-- the repair of dangling tool calls: the history end it was computed for, the position to insert at,
-- the tool messages. The repair is skipped when the history changed since it was computed.
-- Returns {the message's absolute position, the history's absolute end}, or -1 when fenced off.
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
local start = redis.call('HGET', KEYS[1], 'history_start')
if start then return {tonumber(start), history_end(KEYS[2], KEYS[3])} end
local base = tonumber(redis.call('GET', KEYS[3]) or '0')
if #ARGV > 6 and base + redis.call('LLEN', KEYS[2]) == tonumber(ARGV[5]) and tonumber(ARGV[6]) > base then
  local at = tonumber(ARGV[6]) - base
  local after = redis.call('LRANGE', KEYS[2], at, -1)
  redis.call('LTRIM', KEYS[2], 0, at - 1)
  redis.call('RPUSH', KEYS[2], unpack(ARGV, 7))
  if #after > 0 then redis.call('RPUSH', KEYS[2], unpack(after)) end
end
local position = base + redis.call('RPUSH', KEYS[2], ARGV[2]) - 1
redis.call('EXPIRE', KEYS[2], ARGV[3])
trim(KEYS[2], KEYS[3], ARGV[4], ARGV[3])
redis.call('HSET', KEYS[1], 'history_start', position)
return {position, history_end(KEYS[2], KEYS[3])}
