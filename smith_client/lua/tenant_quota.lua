-- A tenant's token quota and the tokens its turns used in the current window (smith_client/tenants.py
-- queue_quota; docs/tenants.md): read by `smith tenant show` and by the turn workers at a turn's start and before
-- each model call of a tenant with a quota (smith_worker/agent/quota.py).
-- KEYS: the tenant's limits hash. ARGV: the QUOTA_ARGC quota arguments (lib.lua's quota_window), now (epoch s).
-- Returns {used tokens, quota (0: none), the window's end (epoch s), the window (s)}.
return tenant_quota(KEYS[1], ARGV, ARGV[QUOTA_ARGC + 1])
