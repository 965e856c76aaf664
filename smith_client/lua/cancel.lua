-- Ask a turn to stop (smith_client/turns.py). A turn that never started is cancelled here;
-- a started one (attempt > 0) is cancelled by its worker, which repairs the history first.
-- KEYS: state, conversation FIFO, conversation statuses. ARGV: turn id, reason, control channel.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if TERMINAL[st] then return st end
redis.call('HSET', KEYS[1], 'cancel_requested', ARGV[2])
if st == 'queued' and redis.call('HGET', KEYS[1], 'attempt') == '0' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled')
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return 'cancelled_queued'
end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 'cancelling'
