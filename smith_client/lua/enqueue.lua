-- arq's enqueue_job in one round trip, for every enqueuer (smith_client/enqueue.py): the same job
-- record (arq's serializer) and the same rule, a job id already queued, running or holding a result
-- is not enqueued again; atomic in one script instead of WATCH/MULTI. It also wakes the queue's workers
-- that can run the job (lib.lua's enqueue_job).
-- KEYS: arq job key, arq result key, queue, wake-up list, requirements hash, capability sets[, skip key].
-- ARGV: job expiry ms, job bytes, score ms, job id, wake-up list TTL s, wake-up list cap, need, refuse
--       ('1'/'0'), now ms, capability set key prefix, capability set wake-up list prefix, fair ('1'/'0'),
--       tenant, tenant waiting ZSET prefix, tenant ring (lib.lua's enqueue_job).
-- Replies 1 when enqueued, 0 when arq has the job id, -1 when the skip key exists (a tool call's
-- result key: the call is answered already, so its job is not enqueued again; smith_worker/tools/waiter.py),
-- -2 when refused: live workers exist but none serves what the job needs.
if KEYS[7] and redis.call('EXISTS', KEYS[7]) == 1 then return -1 end
return enqueue_job({unpack(KEYS, 1, 6)}, {unpack(ARGV, 1, ENQUEUE_ARGC)})
