-- Ask a turn to stop (smith_client/turns.py). A turn that never started is cancelled here. A started one
-- (attempt > 0) is cancelled by a turn worker, which first answers its dangling tool calls (the results of
-- those that ran, docs/architecture.md, Tool-call pairing) and keeps the user messages merged into it: a
-- running turn's own worker is told on the control channel; a paused one, which no worker holds, is queued
-- again (its run_turn job enqueued, lib.lua's enqueue_job) and whichever worker takes it ends it so.
-- KEYS: state, conversation FIFO, conversation statuses, paused ZSET, then the enqueue keys (arq job, arq
--       result, turns queue, wake-up list, requirements hash, capability sets).
-- ARGV: turn id, reason, control channel, then the ENQUEUE_ARGC enqueue arguments (enqueue.lua's), then the
--       ids of the jobs that may hold the turn's place in its tenant's waiting ZSET (docs/architecture.md,
--       Fair pickup): a turn cancelled before it started leaves the line at once, not when its admission
--       finds it cancelled.
-- Returns 'missing' | a terminal status | 'cancelled_queued' | 'cancelling'.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if TERMINAL[st] then return st end
redis.call('HSET', KEYS[1], 'cancel_requested', ARGV[2])
if st == 'paused' then
  redis.call('HSET', KEYS[1], 'status', 'queued')
  redis.call('HSET', KEYS[3], ARGV[1], 'queued')
  redis.call('ZREM', KEYS[4], ARGV[1])
  enqueue_job({unpack(KEYS, 5, 10)}, {unpack(ARGV, 4, 3 + ENQUEUE_ARGC)})
  return 'cancelling'
end
if st == 'queued' and redis.call('HGET', KEYS[1], 'attempt') == '0' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled')
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  -- the enqueue arguments' tenant and waiting-ZSET prefix (lib.lua's enqueue_job: a[13], a[14])
  local waiting = ARGV[3 + 14] .. ARGV[3 + 13]
  for i = 4 + ENQUEUE_ARGC, #ARGV do
    if redis.call('ZREM', waiting, ARGV[i]) == 1 then redis.call('HDEL', KEYS[9], ARGV[i]) end
  end
  return 'cancelled_queued'
end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 'cancelling'
