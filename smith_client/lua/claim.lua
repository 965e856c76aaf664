-- Claim the ready jobs of an arq queue for one worker, in one round trip (smith_worker/claim.py): what
-- arq 0.28 sends per job over six (its poll; start_jobs: WATCH, EXISTS, ZSCORE, MULTI PSETEX EXEC; the
-- first transaction of run_job: GET the job, INCRBY and EXPIRE its try counter, ZREM its abort request),
-- atomic, so two workers never both claim a job and nothing needs WATCH. As arq: a job whose in-progress
-- key exists runs elsewhere and is skipped; a claimed one gets its in-progress key, its try counted and,
-- on workers that abort jobs, its abort request taken (an aborted job fails before it starts).
-- It also pops one wake-up token per job claimed beyond the tokens the worker's wait already took,
-- and reads the score of the queue's next deferred job, which bounds that wait (smith_worker/pickup.py).
-- A worker its wait's tokens woke claims no more jobs than the tokens it holds and those still listed:
-- the others' tokens went to other idle workers, whose claims take those jobs, so the jobs of a burst
-- are spread over the idle workers. Woken otherwise (the fallback poll, a deferred job due, a slot
-- freed), it claims every ready job it has slots for, as arq does.
-- A claim is a lease until the worker confirms it (lua/confirm_claims.lua): the in-progress key holds
-- the claim's marker 'claim:<lease end ms>:<claimer>' until then, arq's '1' after. A claim whose reply
-- never reached its worker (Redis ran it after the worker's socket timeout) is never confirmed: once its
-- lease has ended the job is claimable again, and its try is not counted twice (it never started).
-- KEYS: queue, its wake-up list, arq abort set.
-- ARGV: now ms, free slots, read limit, in-progress TTL ms, try counter TTL s, tokens held,
--       take aborts (1 or 0), this claim's marker, then arq's in-progress, job and retry key prefixes
--       (Keys.arq_claim_prefixes): the ids of the jobs come from the queue, so their keys cannot be given
--       in KEYS.
-- Returns {next deferred score or nil, then for each job claimed: id, score, job record or nil
--          (expired), try, 1 if it had an abort request else 0}.
local queue, wake_list, aborts = KEYS[1], KEYS[2], KEYS[3]
local now, limit, in_progress_ttl, retry_ttl = ARGV[1], ARGV[3], ARGV[4], ARGV[5]
local free, held, take_aborts = tonumber(ARGV[2]), tonumber(ARGV[6]), ARGV[7] == '1'
local marker, in_progress_prefix, job_prefix, retry_prefix = ARGV[8], ARGV[9], ARGV[10], ARGV[11]

-- Whether a job with in-progress value `current` can be claimed, and whether its try is counted:
-- free (no value), or an unconfirmed claim whose lease has ended (its try was counted, never used).
local function claimable(current)
  if not current then return true, true end
  local lease_end = string.match(current, '^claim:(%d+):')
  return lease_end ~= nil and tonumber(lease_end) < tonumber(now), false
end

local reply = {false}
local claimed = 0
if held > 0 then free = math.min(free, held + redis.call('LLEN', wake_list)) end
if free > 0 then
  local ready = redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #ready, 2 do
    if claimed == free then break end
    local id = ready[i]
    local in_progress = in_progress_prefix .. id
    local take, count_try = claimable(redis.call('GET', in_progress))
    if take then
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
      claimed = claimed + 1
    end
  end
end
if claimed > held then redis.call('LPOP', wake_list, claimed - held) end
local deferred = redis.call('ZRANGEBYSCORE', queue, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if #deferred > 0 then reply[1] = deferred[2] end
return reply
