-- Claim the ready jobs of an arq queue for one worker, in one round trip (smith_worker/queue/claim.py): what
-- arq 0.28 sends per job over six (its poll; start_jobs: WATCH, EXISTS, ZSCORE, MULTI PSETEX EXEC; the
-- first transaction of run_job: GET the job, INCRBY and EXPIRE its try counter, ZREM its abort request),
-- atomic, so two workers never both claim a job and nothing needs WATCH. As arq: a job whose in-progress
-- key exists runs elsewhere and is skipped; a claimed one gets its in-progress key, its try counted and,
-- on workers that abort jobs, its abort request taken (an aborted job fails before it starts).
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
-- KEYS: queue, its wake-up list, the wake-up list of the worker's capability set, the queue's
--       requirements hash, the worker's capability set, arq abort set.
-- ARGV: now ms, free slots, read limit, in-progress TTL ms, try counter TTL s, tokens held from the
--       queue's list, tokens held from the set's list, take aborts (1 or 0), check requirements (1 or 0:
--       a claimer outside the fleet, which has no set, takes any job), this claim's marker, then arq's
--       in-progress, job and retry key prefixes (Keys.arq_claim_prefixes): the ids of the jobs come from
--       the queue, so their keys cannot be given in KEYS; then the ids of the worker's jobs that ended.
-- Returns {next deferred score or nil, then for each job claimed: id, score, job record or nil
--          (expired), try, 1 if it had an abort request else 0}.
local queue, wake_list, set_wake_list, requirements, capabilities, aborts = unpack(KEYS, 1, 6)
local now, limit, in_progress_ttl, retry_ttl = ARGV[1], ARGV[3], ARGV[4], ARGV[5]
local free, held, held_set = tonumber(ARGV[2]), tonumber(ARGV[6]), tonumber(ARGV[7])
local take_aborts, check, marker = ARGV[8] == '1', ARGV[9] == '1', ARGV[10]
local in_progress_prefix, job_prefix, retry_prefix = ARGV[11], ARGV[12], ARGV[13]

if #ARGV >= 14 then
  local ended = {unpack(ARGV, 14)}
  for i, score in ipairs(redis.call('ZMSCORE', queue, unpack(ended))) do
    if not score then redis.call('HDEL', requirements, ended[i]) end
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

local reply = {false}
local claimed, claimed_set = 0, 0
if held + held_set > 0 then
  free = math.min(free, held + held_set + redis.call('LLEN', wake_list) + redis.call('LLEN', set_wake_list))
end
if free > 0 then
  local ready = redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #ready, 2 do
    if claimed + claimed_set == free then break end
    local id = ready[i]
    local in_progress = in_progress_prefix .. id
    local take, count_try = claimable(redis.call('GET', in_progress))
    local served, to_set = false, false
    if take then served, to_set = serves(id) end
    if served then
      redis.call('PSETEX', in_progress, in_progress_ttl, marker)
      local retry = retry_prefix .. id
      local try = tonumber(redis.call('GET', retry))
      if count_try or not try then try = redis.call('INCR', retry) end
      redis.call('EXPIRE', retry, retry_ttl)
      local aborted = 0
      if take_aborts then aborted = redis.call('ZREM', aborts, id) end
      local n = #reply
      reply[n + 1], reply[n + 2], reply[n + 3] = id, ready[i + 1], redis.call('GET', job_prefix .. id)
      reply[n + 4], reply[n + 5] = try, aborted
      if to_set then claimed_set = claimed_set + 1 else claimed = claimed + 1 end
    end
  end
end
if claimed > held then redis.call('LPOP', wake_list, claimed - held) end
if claimed_set > held_set then redis.call('LPOP', set_wake_list, claimed_set - held_set) end
if redis.call('EXISTS', queue) == 0 then redis.call('DEL', requirements) end
local deferred = redis.call('ZRANGEBYSCORE', queue, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if #deferred > 0 then reply[1] = deferred[2] end
return reply
