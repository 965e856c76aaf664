-- The conversation's oldest unfinished turn and its status, {} if none; drops finished ones on the way.
-- KEYS: conversation FIFO, conversation statuses.
local active = unfinished_turns(KEYS[1], KEYS[2])
if #active == 0 then return {} end
return {active[1], redis.call('HGET', KEYS[2], active[1])}
