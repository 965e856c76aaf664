-- Remove a worker's registration at its graceful stop (smith_worker/ops/registration.py unregister_worker),
-- unless another process instance holds the id now. KEYS: the registration, the live-workers ZSET.
-- ARGV: worker id, instance. Returns 1 when removed (or already gone), 0 when another instance holds it.
local _, mine = registration(KEYS[1], ARGV[2])
if not mine then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
