-- arq's enqueue_job in one round trip, for every enqueuer (smith_client/enqueue.py): the same job
-- record (arq's serializer) and the same rule, a job id already queued, running or holding a result
-- is not enqueued again; atomic in one script instead of WATCH/MULTI. It also wakes the queue's workers.
-- KEYS: arq job key, arq result key, queue, wake-up list.
-- ARGV: job expiry ms, job bytes, score ms, job id, wake-up list TTL s, wake-up list cap.
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
redis.call('PSETEX', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
wake(KEYS[4], ARGV[5], ARGV[6])
return 1
