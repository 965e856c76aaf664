-- Claim the ready jobs of an arq queue for one worker, in one round trip (smith_worker/queue/claim.py): what
-- arq 0.28 sends per job over six (its poll; start_jobs: WATCH, EXISTS, ZSCORE, MULTI PSETEX EXEC; the
-- first transaction of run_job: GET the job, INCRBY and EXPIRE its try counter, ZREM its abort request),
-- atomic, so two workers never both claim a job and nothing needs WATCH. As arq: a job whose in-progress
-- key exists runs elsewhere and is skipped; a claimed one gets its in-progress key, its try counted and,
-- on workers that abort jobs, its abort request taken (an aborted job fails before it starts) from the
-- prefix's abort set (Keys.abort_set), which stands in for arq's global one.
-- A job listed in the queue's requirements hash (lib.lua's enqueue_job) is claimed only by a worker whose
-- capability set holds what it requires (smith_worker/routing.py); the others leave it queued, untouched,
-- for the workers that serve it, which its wake-up token went to.
-- It also pops one wake-up token per job claimed beyond the tokens the worker's wait already took, from
-- the list the job's token went to, and reads the score of the queue's next deferred job, which bounds
-- that wait (smith_worker/queue/pickup.py).
-- A worker its wait's tokens woke claims no more jobs than the tokens it holds and those still listed:
-- the others' tokens went to other idle workers, whose claims take those jobs, so the jobs of a burst
-- are spread over the idle workers. Woken otherwise (the fallback poll, a deferred job due, a slot
-- freed), it claims every ready job it has slots for, as arq does.
-- A claim is a lease until the worker confirms it (lua/confirm_claims.lua): the in-progress key holds
-- the claim's marker 'claim:<lease end ms>:<claimer>' until then, arq's '1' after. A claim whose reply
-- never reached its worker (Redis ran it after the worker's socket timeout) is never confirmed: once its
-- lease has ended the job is claimable again, and its try is not counted twice (it never started).
-- The worker also names its jobs that ended since its last claim: those no longer queued (arq keeps a
-- job it re-runs) leave the requirements hash, which goes whole once the queue is empty.
-- Reading the queue's ready jobs walks the jobs running on it as well (arq keeps a job on its queue until
-- it ends), one GET each: thousands at a time for turns in flight. On a queue whose jobs due now wait for
-- admission (turns), its own ready jobs are only deferred jobs come due, arq's re-runs and lapsed claims,
-- so the worker asks for that walk only now and then (smith_worker/queue/worker.py); a job of its own that
-- ended but is still queued (arq re-runs it) asks for it too.
-- Turn jobs wait for admission on their tenant's waiting ZSET (lib.lua's enqueue_job), not on the queue:
-- once the jobs on the queue (re-runs, deferred jobs now due) are claimed, the free slots left go to the
-- tenants of the ring (Keys.tenant_ring) by start-time fair queuing: the tenant with the lowest pass
-- gives its oldest job this worker serves, which joins the queue and is claimed as any other, and its
-- pass grows by 1/weight, so tenants with waiting work take turns in proportion to their weights and a
-- tenant's jobs keep their order (docs/architecture.md, Fair pickup). A tenant's weight and `max_running`
-- come from its limits hash (Keys.tenant_limits), else the worker's default weights (SMITH_TENANT_WEIGHTS),
-- else weight 1 and no cap; a capped tenant's admitted jobs are kept in its running ZSET (Keys.tenant_running)
-- until their arq in-progress key is gone.
-- KEYS: queue, its wake-up list, the wake-up list of the worker's capability set, the queue's
--       requirements hash, the worker's capability set, the prefix's abort set, the queue's tenant ring.
-- ARGV: now ms, free slots, read limit, in-progress TTL ms, try counter TTL s, tokens held from the
--       queue's list, tokens held from the set's list, take aborts (1 or 0), check requirements (1 or 0:
--       a claimer outside the fleet, which has no set, takes any job), this claim's marker, then arq's
--       in-progress, job and retry key prefixes (Keys.arq_claim_prefixes): the ids of the jobs come from
--       the queue, so their keys cannot be given in KEYS; then the prefixes of a tenant's waiting and
--       running ZSETs (Keys.tenant_prefixes), the prefix and suffix of a tenant's limits hash
--       (Keys.tenant_limits_affixes), the default weights as a JSON object (tenant -> weight; '' is no
--       tenant), the names of the hash's weight and max_running fields, each followed by its least and most
--       value (smith_client/tenants.py LIMIT_RANGES: a stored value out of range is read as the nearest bound,
--       docs/tenants.md), whether to read the queue's ready jobs (1 or 0); then the ids of the worker's jobs
--       that ended.
-- Returns {next deferred score or nil, 1 if the queue's ready jobs were read and filled the free slots (more
--          may be ready) else 0, then for each job claimed: id, score, job record or nil (expired), try,
--          1 if it had an abort request else 0}.
local queue, wake_list, set_wake_list, requirements, capabilities, aborts, ring = unpack(KEYS, 1, 7)
local now, limit, in_progress_ttl, retry_ttl = ARGV[1], ARGV[3], ARGV[4], ARGV[5]
local free, held, held_set = tonumber(ARGV[2]), tonumber(ARGV[6]), tonumber(ARGV[7])
local take_aborts, check, marker = ARGV[8] == '1', ARGV[9] == '1', ARGV[10]
local in_progress_prefix, job_prefix, retry_prefix = ARGV[11], ARGV[12], ARGV[13]
local waiting_prefix, running_prefix, limits_prefix, limits_suffix = ARGV[14], ARGV[15], ARGV[16], ARGV[17]
local default_weights, weight_field, cap_field = cjson.decode(ARGV[18]), ARGV[19], ARGV[22]
local least_weight, most_weight, least_cap, most_cap = ARGV[20], ARGV[21], ARGV[23], ARGV[24]
local scan = ARGV[25] == '1'

if #ARGV >= 26 then
  local ended = {unpack(ARGV, 26)}
  for i, score in ipairs(redis.call('ZMSCORE', queue, unpack(ended))) do
    if score then scan = true else redis.call('HDEL', requirements, ended[i]) end
  end
end

-- Whether a job with in-progress value `current` can be claimed, and whether its try is counted:
-- free (no value), or an unconfirmed claim whose lease has ended (its try was counted, never used).
local function claimable(current)
  if not current then return true, true end
  local lease_end = string.match(current, '^claim:(%d+):')
  return lease_end ~= nil and tonumber(lease_end) < tonumber(now), false
end

-- Whether this worker may run job `id`, and whether its wake-up token went to the capability sets' lists
-- (requirement entries start with '@') rather than the queue's ('*', or no entry).
local function serves(id)
  if not check then return true, false end
  local need = redis.call('HGET', requirements, id)
  if not need then return true, false end
  return redis.call('SISMEMBER', capabilities, string.sub(need, 2)) == 1, string.sub(need, 1, 1) == '@'
end

local reply = {false, 0}
local claimed, claimed_set = 0, 0

-- Claim job `id` (queue score `score`): its in-progress key holds this claim's marker, its try is counted
-- unless its lapsed claim counted it (`count_try` false), its abort request is taken; it joins the reply.
local function claim(id, score, count_try, to_set)
  redis.call('PSETEX', in_progress_prefix .. id, in_progress_ttl, marker)
  local retry = retry_prefix .. id
  local try = tonumber(redis.call('GET', retry))
  if count_try or not try then try = redis.call('INCR', retry) end
  redis.call('EXPIRE', retry, retry_ttl)
  local aborted = 0
  if take_aborts then aborted = redis.call('ZREM', aborts, id) end
  local n = #reply
  reply[n + 1], reply[n + 2], reply[n + 3] = id, score, redis.call('GET', job_prefix .. id)
  reply[n + 4], reply[n + 5] = try, aborted
  if to_set then claimed_set = claimed_set + 1 else claimed = claimed + 1 end
end

-- A tenant's weight (> 0) and how many more of its jobs may be admitted now (nil: no cap).
local function share(tenant)
  local weight, cap
  if tenant ~= '' then
    local limits = hash_fields(limits_prefix .. tenant .. limits_suffix, weight_field, cap_field)
    weight, cap = bounded(limits[1], least_weight, most_weight), bounded(limits[2], least_cap, most_cap)
  end
  weight = weight or tonumber(default_weights[tenant]) or 1
  if not cap then return weight, nil end
  local running = running_prefix .. tenant
  local room = cap
  for _, id in ipairs(redis.call('ZRANGE', running, 0, -1)) do
    if redis.call('EXISTS', in_progress_prefix .. id) == 1 then room = room - 1 else redis.call('ZREM', running, id) end
  end
  return weight, math.max(room, 0)
end

-- Admit and claim the oldest waiting job of `tenant` that this worker serves (read `limit` deep at most,
-- a few at a time); false when none. A capped tenant's job joins its running ZSET.
local function admit(tenant, capped)
  local waiting = waiting_prefix .. tenant
  local start = 0
  while start < tonumber(limit) do
    local batch = redis.call('ZRANGE', waiting, start, start + 15, 'WITHSCORES')
    if #batch == 0 then return false end
    for i = 1, #batch, 2 do
      local id = batch[i]
      local served, to_set = serves(id)
      if served then
        redis.call('ZREM', waiting, id)
        redis.call('ZADD', queue, batch[i + 1], id)
        claim(id, batch[i + 1], true, to_set)
        if capped then
          local running = running_prefix .. tenant
          redis.call('ZADD', running, tonumber(now) + tonumber(in_progress_ttl), id)
          redis.call('PEXPIRE', running, in_progress_ttl)
        end
        return true
      end
    end
    start = start + 16
  end
  return false
end

-- Read the ring from rank `start`, `RING_PAGE` entries, into `tenants` (each with its pass, weight and room),
-- leaving out those already read (`seen`); returns how many were new.
local RING_PAGE, RING_PAGES = 1000, 10
local function read_ring(tenants, seen, start)
  local entries = redis.call('ZRANGE', ring, start, start + RING_PAGE - 1, 'WITHSCORES')
  local added = 0
  for i = 1, #entries, 2 do
    if not seen[entries[i]] then
      seen[entries[i]] = true
      local weight, room = share(entries[i])
      tenants[#tenants + 1] = {name = entries[i], pass = tonumber(entries[i + 1]), weight = weight, room = room}
      added = added + 1
    end
  end
  return added
end

-- The free slots left go to the ring's tenants, lowest pass first (see the header). `tenants` holds the
-- lowest-pass tenants read so far, a page of 1000 at a time; one that cannot give a job now (capped, or nothing
-- this worker serves) is left out of this claim. Once every tenant read is out, the next page is read (10 at
-- most), so tenants at their cap ahead in the ring do not keep the others from free slots. The tenants read and
-- neither admitted nor removed hold the ring's lowest ranks (their passes are unchanged and were the lowest),
-- so the next page starts past them; an admitted tenant, moved on, may come again and is skipped (`seen`).
local function admit_fairly()
  local tenants, seen, pages, moved, removed = {}, {}, 1, 0, 0
  read_ring(tenants, seen, 0)
  while claimed + claimed_set < free do
    local best
    for _, t in ipairs(tenants) do
      if not t.out and (not best or t.pass < best.pass) then best = t end
    end
    if not best then
      if pages == RING_PAGES or read_ring(tenants, seen, #tenants - moved - removed) == 0 then return end
      pages = pages + 1
    elseif best.room == 0 or not admit(best.name, best.room ~= nil) then
      best.out = true
      -- its jobs' records (and so its waiting ZSET) expired: it has nothing to wait for
      if redis.call('EXISTS', waiting_prefix .. best.name) == 0 then
        redis.call('ZREM', ring, best.name)
        removed = removed + 1
      end
    else
      if not best.moved then best.moved, moved = true, moved + 1 end
      best.pass = best.pass + 1 / best.weight
      if best.room then best.room = best.room - 1 end
      if redis.call('EXISTS', waiting_prefix .. best.name) == 0 then
        redis.call('ZREM', ring, best.name)
        best.out = true
        moved, removed = moved - 1, removed + 1
      else
        redis.call('ZADD', ring, 'XX', best.pass, best.name)
      end
    end
  end
end

if held + held_set > 0 then
  free = math.min(free, held + held_set + redis.call('LLEN', wake_list) + redis.call('LLEN', set_wake_list))
end
if free > 0 and scan then
  local ready = redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #ready, 2 do
    if claimed + claimed_set == free then
      reply[2] = 1
      break
    end
    local id = ready[i]
    local take, count_try = claimable(redis.call('GET', in_progress_prefix .. id))
    local served, to_set = false, false
    if take then served, to_set = serves(id) end
    if served then claim(id, ready[i + 1], count_try, to_set) end
  end
end
if free > 0 and claimed + claimed_set < free then admit_fairly() end
if claimed > held then redis.call('LPOP', wake_list, claimed - held) end
if claimed_set > held_set then redis.call('LPOP', set_wake_list, claimed_set - held_set) end
if redis.call('EXISTS', queue, ring) == 0 then redis.call('DEL', requirements) end
local deferred = redis.call('ZRANGEBYSCORE', queue, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if #deferred > 0 then reply[1] = deferred[2] end
return reply
