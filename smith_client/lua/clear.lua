-- Delete a conversation's own keys unless it has an unfinished turn (smith_client/operations.py clear).
-- KEYS: the conversation FIFO, its statuses hash, then its message and memory keys.
-- Returns the id of an unfinished turn (nothing deleted), or '' after deleting the keys.
local active = unfinished_turns(KEYS[1], KEYS[2])
if #active > 0 then return active[1] end
redis.call('DEL', unpack(KEYS, 3))
return ''
