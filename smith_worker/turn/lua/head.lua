-- The conversation's oldest unfinished turn and its status, {} if none; drops finished ones on the way.
-- KEYS: conversation FIFO, conversation statuses.
return conversation_head(KEYS[1], KEYS[2])
