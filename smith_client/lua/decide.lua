-- Record a decision on a paused turn's pending call (smith_client/approvals.py; docs/architecture.md,
-- Pausing for a person). The first decision on a call stays; when every pending call has one, the turn is
-- queued again and its run_turn job enqueued (lib.lua's enqueue_job) under a job id of its own.
-- KEYS: state, pending, decisions, paused ZSET, conversation statuses, then the enqueue keys (arq job, arq
--       result, turns queue, wake-up list, requirements hash, capability sets).
-- ARGV: turn id, call id ('' = every undecided call: the sweeper's timeout), decision JSON, the attempt that
--       paused the turn (as the caller read it), then the ENQUEUE_ARGC enqueue arguments (enqueue.lua's).
-- Returns {'same', first decision} | {'missing', undecided call ids...}: the call is not pending, or the turn
-- is not paused | {'stale'}: the turn paused again since the caller read it | {'decided', decision, resumed}
-- with resumed '1' when this decision completed the step and the turn was enqueued.
local state, pending, decisions, paused, statuses = unpack(KEYS, 1, 5)
local turn_id, call_id, decision, attempt = unpack(ARGV, 1, 4)
if call_id ~= '' then
  local first = redis.call('HGET', decisions, call_id)
  if first then return {'same', first} end
end
local function undecided()
  local ids = {}
  for _, id in ipairs(redis.call('HKEYS', pending)) do
    if redis.call('HEXISTS', decisions, id) == 0 then ids[#ids + 1] = id end
  end
  return ids
end
if redis.call('HGET', state, 'status') ~= 'paused' then
  redis.call('ZREM', paused, turn_id)
  return {'missing'}
end
if call_id ~= '' and redis.call('HEXISTS', pending, call_id) == 0 then return {'missing', unpack(undecided())} end
if redis.call('HGET', state, 'attempt') ~= attempt then return {'stale'} end
if call_id == '' then
  for _, id in ipairs(undecided()) do redis.call('HSET', decisions, id, decision) end
else
  redis.call('HSET', decisions, call_id, decision)
end
local life = redis.call('PTTL', pending)
if life > 0 then redis.call('PEXPIRE', decisions, life) end
if redis.call('HLEN', decisions) < redis.call('HLEN', pending) then return {'decided', decision, '0'} end
redis.call('HSET', state, 'status', 'queued', 'resumed_by', 'decision')
redis.call('HSET', statuses, turn_id, 'queued')
redis.call('ZREM', paused, turn_id)
enqueue_job({unpack(KEYS, 6, 11)}, {unpack(ARGV, 5, 4 + ENQUEUE_ARGC)})
return {'decided', decision, '1'}
