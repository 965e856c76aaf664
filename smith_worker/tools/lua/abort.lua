-- Abort an arq job of the tools queue, queued or running (smith_worker/tools/waiter.py abort_job).
-- The abort request goes in the prefix's abort set (Keys.abort_set, in place of arq's global one), pruned
-- of entries older than its TTL (arq's pruning removes nothing, #485); a queued job is removed so it never
-- starts; a running one is cancelled by its worker at its next poll, so every tool worker is told to poll
-- now on a channel (one wake-up token would reach one idle worker, maybe not the one running the job).
-- KEYS: the prefix's abort set, arq in-progress key, queue, arq job key, the tool-aborts channel, the
--       queue's requirements hash (a removed job's entry goes with it).
-- ARGV: job id, now ms, abort entry TTL s.
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl * 1000)
-- when the set expires, its newest entry is ttl old: nothing live is lost
redis.call('EXPIRE', KEYS[1], ttl)
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('DEL', KEYS[4])
  redis.call('HDEL', KEYS[6], ARGV[1])
else
  redis.call('PUBLISH', KEYS[5], ARGV[1])
end
return 1
