-- Count one agent's model calls and tokens in a usage bucket and give the bucket its TTL, in one command
-- (smith_worker/ops/usage.py queue_count; docs/architecture.md, Token usage): the counts never land without it.
-- KEYS: the bucket (HASH). ARGV: its TTL (seconds), then field, amount pairs (amounts not 0).
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
