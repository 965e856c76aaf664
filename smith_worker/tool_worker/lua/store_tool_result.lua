-- Store a finished tool call's outcome and announce it, in one round trip (smith_worker/tool_worker/job.py).
-- KEYS: result key, reply channel, then publish.lua's KEYS for the tool.result event.
-- ARGV: outcome JSON, result TTL seconds, largest outcome (bytes) the reply carries, then publish.lua's ARGV.
-- First writer wins: when the result key exists (the turn gave up on the call, or another run stored
-- it), nothing else happens and the reply is 0. Otherwise the event is published as publish.lua would
-- (fenced, once per marker: it may be refused, the outcome stays stored for the turn to find) and the
-- waiting turn worker is woken with "<result key>\n<outcome JSON>", or the bare result key when the
-- outcome is over ARGV[3] bytes (smith_client/jobs.py, reply_message); the reply is 1.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 0 end
publish_event(KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
if #ARGV[1] <= tonumber(ARGV[3]) then
  redis.call('PUBLISH', KEYS[2], KEYS[1] .. '\n' .. ARGV[1])
else
  redis.call('PUBLISH', KEYS[2], KEYS[1])
end
return 1
