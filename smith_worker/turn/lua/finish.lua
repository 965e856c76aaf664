-- The fenced final write of an attempt (committed with the terminal event).
-- KEYS: state, running ZSET, conversation FIFO, inbox, history, conversation statuses, the worker's running
--       turns SET (the turn leaves it).
-- ARGV: turn id, attempt, status, field, value, turn TTL s, history TTL s.
-- Merged user messages the turn did not get to (it was cancelled or failed first) are kept:
-- moved to the history, after what the turn completed. Returns 1, or 0 when fenced off: the attempt
-- is not the current one, or the turn is not running. The second guard keeps a turn's status and its
-- terminal event in agreement: the terminal event in the same transaction is dropped on the same test
-- (fenced_off), so an attempt that already ended the turn (completed, its reply lost to a cancel of
-- the task awaiting it) cannot rewrite the status as cancelled behind a logged turn.completed.
if fenced_off(KEYS[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[3], ARGV[4], ARGV[5], 'inbox_closed', '1', 'lease_until', 0)
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('LREM', KEYS[3], 0, ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('SREM', KEYS[7], ARGV[1])
local merged = redis.call('LRANGE', KEYS[4], 0, -1)
if #merged > 0 then
  redis.call('RPUSH', KEYS[5], unpack(merged))
  redis.call('EXPIRE', KEYS[5], ARGV[7])
end
redis.call('DEL', KEYS[4])
return 1
