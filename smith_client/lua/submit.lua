-- Create (or attach to) a turn and apply the conversation's multitask policy (smith_client/turns.py);
-- a new turn's arq job is enqueued in the same call (lib.lua's enqueue_job), and again on an attach to
-- a turn still queued (a first caller may have died before its enqueue; arq's rule makes it a no-op).
-- KEYS: state, conversation FIFO, conversation statuses, the enqueue keys (arq job, arq result, turns
--       queue, wake-up list, requirements hash, capability sets), the turn's context record, then for each
--       turn named in ARGV[CONTEXT + QUOTA_ARGC + 1 ..] (CONTEXT = 12 + ENQUEUE_ARGC): its state, its inbox; last, for a turn of a
--       tenant, the tenant's limits hash.
-- ARGV: turn id, fingerprint, conversation, agent, policy, message JSON, now (epoch s),
--       turn TTL s, conversation TTL s, job JSON, control channel, the ENQUEUE_ARGC enqueue arguments
--       (lib.lua's enqueue_job; the job needs its agent), the caller context's JSON ('' for none: docs/architecture.md, Caller
--       context), the QUOTA_ARGC quota arguments (lib.lua's quota_window; the counters' prefix '' for a turn
--       without a tenant; docs/tenants.md), then the ids of the other turns this call may touch
--       (merge: the last unfinished one; interrupt: all unfinished ones).
-- Returns {'conflict', id} | {'attach', id, status, alone} | {'busy', id} | {'merged', id, '', alone}
--       | {'quota', id, used, quota, window end (epoch s)}: the tenant's quota is used up (nothing written)
--       | {'new', id, '', alone, paused ids...} | {'unknown', id, served agents...}: live turn workers exist
--       but none serves the agent (nothing written) | {'keys', ids...}: the turns to touch are not those
--       given; call again naming these. `alone` is '1' when no turn worker is live at all (the turn waits).
-- A paused turn (docs/architecture.md, Pausing for a person) takes a merged message into its inbox (its
-- resumed step drains it); `interrupt` marks it like a running one, and the caller has it cancelled as
-- TurnHandle.cancel does (no worker holds it to be told): its id follows `alone` in the 'new' reply.
local turn_id, fp, conv, agent, policy, msg, now, turn_ttl, conv_ttl, job, control = unpack(ARGV, 1, 11)
local state, fifo, statuses = KEYS[1], KEYS[2], KEYS[3]
local function enqueue() return enqueue_job({unpack(KEYS, 4, 9)}, {unpack(ARGV, 12, 11 + ENQUEUE_ARGC)}) end
local CONTEXT = 12 + ENQUEUE_ARGC  -- the index of the caller context's JSON in ARGV; the quota's arguments and the turns follow
-- which live turn workers serve the agent, from their capability sets (ARGV[20] now ms, ARGV[21] set prefix)
local serving, live = serving_sets(KEYS[9], ARGV[21], agent, ARGV[20])
if #serving == 0 and live > 0 then
  local served = {}
  for _, digest in ipairs(redis.call('ZRANGEBYSCORE', KEYS[9], ARGV[20], '+inf')) do
    for _, name in ipairs(redis.call('SMEMBERS', ARGV[21] .. digest)) do served[name] = true end
  end
  local reply = {'unknown', turn_id}
  for name in pairs(served) do reply[#reply + 1] = name end
  return reply
end
local alone = live == 0 and '1' or '0'
local existing = redis.call('HGET', state, 'fingerprint')
if existing then
  if existing ~= fp then return {'conflict', turn_id} end
  local status = redis.call('HGET', state, 'status')
  if status == 'queued' then enqueue() end
  return {'attach', turn_id, status, alone}
end
if ARGV[CONTEXT + 1] ~= '' then  -- a new turn or message of a tenant: refused once its quota is used up
  local used, quota, reset_at = unpack(tenant_quota(KEYS[#KEYS], {unpack(ARGV, CONTEXT + 1, CONTEXT + QUOTA_ARGC)}, now))
  if quota > 0 and used >= quota then return {'quota', turn_id, used, quota, reset_at} end
end
local active = unfinished_turns(fifo, statuses)
if #active > 0 then
  if policy == 'reject' then return {'busy', active[1]} end
  local wanted = {}
  if policy == 'merge' then wanted = {active[#active]} elseif policy == 'interrupt' then wanted = active end
  local given = {unpack(ARGV, CONTEXT + QUOTA_ARGC + 1)}
  local same = #given == #wanted
  for i, id in ipairs(wanted) do same = same and given[i] == id end
  if not same then return {'keys', unpack(wanted)} end
  if policy == 'merge' then
    local tstate, inbox = KEYS[11], KEYS[12]
    local tstatus = redis.call('HGET', tstate, 'status')
    if (tstatus == 'running' or tstatus == 'paused') and redis.call('HGET', tstate, 'inbox_closed') ~= '1' then
      redis.call('RPUSH', inbox, msg)
      redis.call('EXPIRE', inbox, turn_ttl)
      return {'merged', wanted[1], '', alone}
    end
  end
end
redis.call('HSET', state, 'status', 'queued', 'fingerprint', fp, 'conversation_id', conv,
           'agent', agent, 'created_at', now, 'attempt', 0, 'job', job)
redis.call('EXPIRE', state, turn_ttl)
if ARGV[CONTEXT] ~= '' then redis.call('SET', KEYS[10], ARGV[CONTEXT], 'EX', turn_ttl) end
redis.call('RPUSH', fifo, turn_id)
redis.call('EXPIRE', fifo, conv_ttl)
redis.call('HSET', statuses, turn_id, 'queued')
redis.call('EXPIRE', statuses, conv_ttl)
local reply = {'new', turn_id, '', alone}
if policy == 'interrupt' then
  for i, id in ipairs(active) do
    redis.call('HSET', KEYS[9 + 2 * i], 'cancel_requested', 'interrupt')
    if redis.call('HGET', KEYS[9 + 2 * i], 'status') == 'paused' then
      reply[#reply + 1] = id
    else
      redis.call('PUBLISH', control, id)
    end
  end
end
enqueue()
return reply
