-- Did a turn's state fall back behind a fenced-off attempt? A turn back at 'queued' with an older
-- attempt than one that ran lost writes (a Redis failover: replication is asynchronous).
-- KEYS: state. ARGV: the stale attempt. Returns the re-enqueue number, or 0.
if redis.call('HGET', KEYS[1], 'status') ~= 'queued' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0') >= tonumber(ARGV[1]) then return 0 end
return redis.call('HINCRBY', KEYS[1], 'requeues', 1)
