-- Fail a turn whose payload no worker here can read (the caller checked, under WATCH, that it had not ended).
-- KEYS: state, running ZSET, conversation FIFO, conversation statuses. ARGV: turn id, error JSON, turn TTL s.
redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[2], 'inbox_closed', '1', 'lease_until', 0)
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('LREM', KEYS[3], 0, ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
