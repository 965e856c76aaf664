-- Take a turn for a new attempt (smith_worker/turn/attempt.py). Only the oldest unfinished turn of a
-- conversation may run: a later one gets {'wait', <id ahead>} and parks.
-- KEYS: state, running ZSET, conversation FIFO, conversation statuses, the worker's running turns SET.
-- ARGV: turn id, worker id, now ms, lease ms, running ZSET TTL s, the attempt's arq job id ('' outside arq).
-- The turn joins its worker's SET of running turns (kept 3 leases past the last start or renewal), by
-- which a dead worker's turns are counted as crashes alone or with others (count_crash). An expired lease
-- taken over here (no sweeper re-enqueued the turn first) counts its dead attempt as a crash alone.
-- A paused turn runs only once its calls are decided (decide.lua queues it): a job that reaches it
-- before (a stale kick or re-run) gets {'paused'}.
-- Returns {'missing'} | {'done', status} | {'paused'} | {'busy'} | {'wait', id} | {'go', attempt, state as HGETALL}:
-- the state the attempt starts from comes back in the same round trip (with `resumed_by`, which decide.lua
-- sets when a decision queued the turn again; the attempt takes it out).
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing'} end
if TERMINAL[st] then return {'done', st} end
if st == 'paused' then return {'paused'} end
if st == 'running' and tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') > tonumber(ARGV[3]) then
  return {'busy'}
end
local ahead = unfinished_turns(KEYS[3], KEYS[4], ARGV[1])
if #ahead > 0 then return {'wait', ahead[1]} end
if st == 'running' then count_crash(KEYS[1], false) end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local until_ms = tonumber(ARGV[3]) + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[2], 'lease_until', until_ms, 'job_id', ARGV[6])
redis.call('SADD', KEYS[5], ARGV[1])
redis.call('PEXPIRE', KEYS[5], 3 * tonumber(ARGV[4]))
redis.call('HSET', KEYS[4], ARGV[1], 'running')
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[5])
local state = redis.call('HGETALL', KEYS[1])
redis.call('HDEL', KEYS[1], 'resumed_by')  -- why this attempt starts: its own, not a later one's
return {'go', attempt, state}
