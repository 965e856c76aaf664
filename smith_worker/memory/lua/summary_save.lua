-- Save SummaryMemory's summary of a conversation (smith_worker/memory/summary.py); moves only forward.
-- KEYS: the summary hash. ARGV: text, covers (position), TTL s. Returns 1 if saved, 0 if an equal or
-- newer summary is there.
local covers = tonumber(redis.call('HGET', KEYS[1], 'covers') or '-1')
if tonumber(ARGV[2]) <= covers then return 0 end
redis.call('HSET', KEYS[1], 'text', ARGV[1], 'covers', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
