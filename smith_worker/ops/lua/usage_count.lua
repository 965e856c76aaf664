-- Count one agent's model calls and tokens in a usage bucket and give the bucket its TTL, in one command
-- (smith_worker/ops/usage.py queue_count; docs/architecture.md, Token usage): the counts never land without it.
-- For a turn of a tenant, its tokens also go to the counter of the tenant's current quota window, which lives the
-- window + a margin (lib.lua's quota_window; docs/tenants.md).
-- KEYS: the bucket (HASH), then for a tenant its limits hash. ARGV: the bucket's TTL (s), the QUOTA_ARGC quota
-- arguments (lib.lua's quota_window; the counters' prefix '' for no tenant), now (epoch s), the tokens to count for
-- the tenant (prompt + completion), the counter's TTL margin (s), then field, amount pairs (amounts not 0).
local now, tokens, margin = ARGV[QUOTA_ARGC + 2], ARGV[QUOTA_ARGC + 3], ARGV[QUOTA_ARGC + 4]
for i = QUOTA_ARGC + 5, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
if ARGV[2] ~= '' and tonumber(tokens) > 0 then
  local counter, window = quota_window(KEYS[2], {unpack(ARGV, 2, QUOTA_ARGC + 1)}, now)
  if not tonumber(redis.pcall('INCRBY', counter, tokens)) then  -- a hand-edited counter, no integer: count afresh
    redis.call('SET', counter, tokens)
  end
  redis.call('EXPIRE', counter, window + tonumber(margin))
end
return 1
