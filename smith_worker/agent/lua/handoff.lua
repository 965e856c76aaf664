-- Make a handoff's target the conversation's current agent (docs/architecture.md, Handoffs), fenced: sent in
-- the round trip appending the transfer's tool message (smith_worker/agent/handoffs.py).
-- KEYS: the turn's state, the conversation's agent key. ARGV: attempt, agent name, history TTL s.
-- Returns 1, or -1 when fenced off (the attempt is no longer the turn's).
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1
