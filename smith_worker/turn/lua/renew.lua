-- Renew the lease of a running attempt. KEYS: state, running ZSET, the worker's running turns SET (it lives
-- 3 leases past this renewal). ARGV: turn id, attempt, now ms, lease ms. A lease that ran out while nobody took the turn over (Redis was
-- unreachable) is renewed too: the attempt is still the turn's. Returns 1, or 0 when the attempt is no
-- longer the turn's running one.
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
local until_ms = tonumber(ARGV[3]) + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'lease_until', until_ms)
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('PEXPIRE', KEYS[3], 3 * tonumber(ARGV[4]))
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
return 1
