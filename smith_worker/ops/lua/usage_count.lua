-- Count one agent's model calls and tokens in a usage bucket and give the bucket its TTL, in one command
-- (smith_worker/ops/usage.py queue_count; docs/architecture.md, Token usage): the counts never land without it.
-- For a turn of a tenant, its tokens also go to the counter of the tenant's current quota window, which lives the
-- window + a margin (lib.lua's quota_window; docs/tenants.md).
-- KEYS: the bucket (HASH), then for a tenant its limits hash. ARGV: the bucket's TTL (s), the tenant's quota
-- counters' prefix ('' for none), the default quota window (s), now (epoch s), the tokens to count for the tenant
-- (prompt + completion), the counter's TTL margin (s), then field, amount pairs (amounts not 0).
for i = 7, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
if ARGV[2] ~= '' and tonumber(ARGV[5]) > 0 then
  local counter, window = quota_window(KEYS[2], ARGV[2], ARGV[3], ARGV[4])
  redis.call('INCRBY', counter, ARGV[5])
  redis.call('EXPIRE', counter, window + tonumber(ARGV[6]))
end
return 1
