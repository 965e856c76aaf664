-- Complete a turn with its final answer, atomically with the inbox's closing drain
-- (smith_worker/turn/attempt.py, TurnAttempt.queue_close): merged user messages that wait join the
-- history and the turn goes on to answer them; when none wait, the inbox closes, `turn.completed` is
-- published and the state becomes completed (finish_turn), so a merge can never fall between them.
-- KEYS: state, running ZSET, conversation FIFO, inbox, history, conversation statuses, the worker's
--       running turns SET, pending, decisions, paused ZSET, trimmed, seq counter, log stream, channel.
-- ARGV: turn id, attempt, 'completed', the result field, the final message JSON, turn TTL s, history TTL s,
--       max messages, the event's JSON without its opening brace, the log's max length.
-- Returns {moved}: the turn goes on; {{}, seq, head}: completed, `head` the conversation's oldest
-- unfinished turn and its status ({} if none); false when fenced off.
local moved = drain_inbox(KEYS[1], KEYS[4], KEYS[5], KEYS[11], ARGV[2], ARGV[7], '1', ARGV[8])
if not moved then return false end
if #moved > 0 then return {moved} end
local seq = publish_event(KEYS[12], KEYS[13], KEYS[14], KEYS[1], nil, ARGV[9], ARGV[10], ARGV[6], ARGV[2])
if seq < 0 then return false end
finish_turn({unpack(KEYS, 1, 10)}, {unpack(ARGV, 1, 7)})
return {{}, seq, conversation_head(KEYS[3], KEYS[6])}
