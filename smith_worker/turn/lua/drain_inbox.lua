-- Move merged user messages into the history, at the start of a step (drain_inbox in lib.lua;
-- complete.lua closes the inbox at a turn's end).
-- KEYS: state, inbox, history, trimmed. ARGV: attempt, history TTL s, max messages.
-- Returns the moved messages, or false when fenced off.
return drain_inbox(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], '0', ARGV[3])
