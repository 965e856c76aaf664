-- Pause a running turn whose step waits for a person (smith_worker/turn/attempt.py, TurnAttempt.pause;
-- docs/architecture.md, Pausing for a person), fenced by the attempt: publishes `turn.paused`, adds the
-- pending calls (decided calls of the step stay, with their decisions: a step pauses again when a sub-agent it
-- resumed waits for a person anew; the step's append deletes them), sets the status `paused` (still unfinished
-- in its conversation, so later turns wait behind it), and the turn leaves the running ZSET and its worker's
-- SET of running turns: no lease, no worker holds it. The turn's state, log, pending calls and decisions, and
-- the keys the resumed step needs (its tool results, so no call that ran runs again on resume, its sub-agents'
-- checkpoints), then live `life` seconds (the caller's bound, also for a pause without a deadline), and the
-- turn is listed in the paused ZSET by its deadline ('' = none: +inf).
-- KEYS: state, running ZSET, the worker's running turns SET, conversation statuses, pending, decisions,
--       paused ZSET, seq counter, log stream, channel, then the keys the resumed step needs.
-- ARGV: turn id, attempt, deadline ms, life s, the event's JSON without its opening brace, the log's max
--       length, the event's TTL s, then call id and item JSON pairs.
-- Returns the event's seq, or -1 when fenced off (the attempt is not the turn's, or the turn is not running).
local state, running, worker_turns, statuses, pending, decisions, paused, seq_key, log, channel = unpack(KEYS, 1, 10)
local turn_id, attempt, deadline, life, body, max_len, event_ttl = unpack(ARGV, 1, 7)
local seq = publish_event(seq_key, log, channel, state, nil, body, max_len, event_ttl, attempt)
if seq < 0 then return -1 end
for i = 8, #ARGV, 2 do redis.call('HSET', pending, ARGV[i], ARGV[i + 1]) end
redis.call('HSET', state, 'status', 'paused', 'lease_until', 0)
redis.call('HSET', statuses, turn_id, 'paused')
redis.call('ZREM', running, turn_id)
redis.call('SREM', worker_turns, turn_id)
local kept = {state, pending, decisions, seq_key, log}
for i = 11, #KEYS do kept[#kept + 1] = KEYS[i] end
for _, key in ipairs(kept) do
  redis.call('EXPIRE', key, life)
end
redis.call('ZADD', paused, deadline == '' and '+inf' or deadline, turn_id)
return seq
