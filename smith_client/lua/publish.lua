-- Publish one event of a turn (smith_client/eventlog.py).
-- KEYS: seq counter, log stream, channel[, turn state[, published-once marker]].
-- ARGV: event JSON without its opening brace, max length, ttl seconds[, attempt].
-- The seq is spliced in as the first field so no JSON library is needed inside Redis (cjson would
-- turn [] into {}). With a state key, the event is dropped (-1) unless the turn is running and
-- (when ARGV[4] is not '') its current attempt is ARGV[4]: the fencing token that keeps a stale
-- attempt silent. Nothing follows a turn's terminal event. With a fifth key (a "published once"
-- marker, which needs the state key), the event is published only if the marker is absent (else 0),
-- and the marker is set with it: an event several processes may try to publish (a tool result
-- landing while its turn changes attempts) goes out exactly once.
if KEYS[4] and (redis.call('HGET', KEYS[4], 'status') ~= 'running'
                or (ARGV[4] ~= '' and redis.call('HGET', KEYS[4], 'attempt') ~= ARGV[4])) then
  return -1
end
if KEYS[5] then
  if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
  redis.call('SET', KEYS[5], '1', 'EX', ARGV[3])
end
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local payload = '{"seq":' .. seq .. ',' .. ARGV[1]
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '0-' .. seq, 'e', payload)
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('PUBLISH', KEYS[3], payload)
return seq
