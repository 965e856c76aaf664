-- Put a running turn back to queued. KEYS: state, running ZSET, conversation statuses, the running turns
-- SET of the attempt's worker (a hand-off leaves it; a dead worker's is read by count_crash and kept).
-- ARGV: turn id, the owner's attempt (a hand-off at shutdown, counted in 'handoffs': it does not use
-- up one of SMITH_TURN_MAX_ATTEMPTS) or '' (the sweeper, which may only take a turn whose lease has
-- expired, and counts the dead attempt: count_crash), now ms. Returns the re-enqueue number, or 0.
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return 0 end
if ARGV[2] == '' and tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') > tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'lease_until', 0)
redis.call('HSET', KEYS[3], ARGV[1], 'queued')
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' then
  redis.call('HINCRBY', KEYS[1], 'handoffs', 1)
  redis.call('SREM', KEYS[4], ARGV[1])
else
  count_crash(KEYS[1], KEYS[4])
end
return redis.call('HINCRBY', KEYS[1], 'requeues', 1)
