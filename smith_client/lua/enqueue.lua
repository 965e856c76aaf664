-- arq's enqueue_job for a blocking client (arq has none): the same job record (arq's serializer) and
-- the same rule, a job id already queued, running or holding a result is not enqueued again; atomic
-- in one script instead of WATCH (smith_client/runners.py).
-- KEYS: arq job key, arq result key, queue. ARGV: job expiry ms, job bytes, score ms, job id.
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
redis.call('PSETEX', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
return 1
