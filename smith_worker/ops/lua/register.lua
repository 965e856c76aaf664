-- Claim or renew a worker id (smith_worker/ops/registration.py register_worker): the registration is
-- written only when nobody holds the id or this process instance does, so two live processes never
-- share one id. KEYS: the registration, the live-workers ZSET. ARGV: worker id, registration JSON
-- (holding "instance"), instance, TTL s, now ms, ZSET TTL s.
-- Returns nil when this instance holds the id now, else {the holder's registration, its PTTL ms}.
local held, mine = registration(KEYS[1], ARGV[3])
if not mine then return {held, redis.call('PTTL', KEYS[1])} end
local ttl, now = tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
redis.call('ZADD', KEYS[2], now + ttl * 1000, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('EXPIRE', KEYS[2], ARGV[6])
return false
