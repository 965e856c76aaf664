-- Ask a turn to stop (smith_client/turns.py). A turn that never started is cancelled here, and so is a
-- paused one (no worker holds it; its dangling tool calls are answered with the conversation's next turn,
-- docs/architecture.md, Tool-call pairing), with its `turn.cancelled` published in the same call and the
-- user messages merged into it kept in the history; a started one (attempt > 0) is cancelled by its
-- worker, which repairs the history first.
-- KEYS: state, conversation FIFO, conversation statuses, pending, decisions, paused ZSET, seq counter,
--       log stream, channel, inbox, history.
-- ARGV: turn id, reason, control channel, turn TTL s, the `turn.cancelled` event's JSON without its
--       opening brace, the log's max length, history TTL s.
-- Returns 'missing' | a terminal status | 'cancelled_queued' | 'cancelling' | {'cancelled_paused', the
-- conversation's oldest unfinished turn and its status (none: absent)}: the caller wakes that turn.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if TERMINAL[st] then return st end
redis.call('HSET', KEYS[1], 'cancel_requested', ARGV[2])
if st == 'paused' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'inbox_closed', '1')
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  leave_unfinished(ARGV[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
  keep_merged(KEYS[10], KEYS[11], ARGV[7])
  publish_event(KEYS[7], KEYS[8], KEYS[9], nil, nil, ARGV[5], ARGV[6], ARGV[4], '')
  return {'cancelled_paused', unpack(conversation_head(KEYS[2], KEYS[3]))}
end
if st == 'queued' and redis.call('HGET', KEYS[1], 'attempt') == '0' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled')
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return 'cancelled_queued'
end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 'cancelling'
