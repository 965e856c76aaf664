-- Publish consecutive events of one turn in one call (smith_client/eventlog.py, EventLog.queue_publish_many).
-- KEYS: seq counter, log stream, channel[, turn state]. ARGV: max length, ttl seconds, attempt, event JSON
-- without its opening brace...
-- Each event gets the next seq, the server's time as its ts (lib.lua's event_head), its own log entry and
-- PUBLISH (SPUBLISH on Redis Cluster), exactly as publish.lua would give them, so a subscriber sees no difference; the fence (as
-- publish.lua's, ARGV[3] '' for any attempt) is checked once for the whole batch. Returns the first event's seq, or -1 when fenced off (nothing published).
if KEYS[4] and fenced_off(KEYS[4], ARGV[3]) then return -1 end
local count = #ARGV - 3
local last = redis.call('INCRBY', KEYS[1], count)
redis.call('EXPIRE', KEYS[1], ARGV[2])
local first = last - count + 1
local now = redis.call('TIME')
for i = 1, count do
  local payload = event_head(first + i - 1, now) .. ARGV[3 + i]
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '0-' .. (first + i - 1), 'e', payload)
  redis.call(publish_command(KEYS[3]), KEYS[3], payload)
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return first
