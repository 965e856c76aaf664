-- Confirm the jobs of one claim (lua/claim.lua) as the worker starts them (smith_worker/queue/claim.py): a job
-- whose in-progress key still holds this claim's marker gets arq's '1' and its full in-progress TTL; one
-- whose lease ended and was claimed again, or that ended meanwhile, is not confirmed and must not run.
-- KEYS: none (the keys are arq's in-progress prefix + the claimed job ids, as in claim.lua).
-- ARGV: the claim's marker, in-progress TTL ms, arq's in-progress key prefix, then the job ids.
-- Returns 1 (confirmed) or 0 per job id, in order.
local marker, in_progress_ttl, in_progress_prefix = ARGV[1], ARGV[2], ARGV[3]
local confirmed = {}
for i = 4, #ARGV do
  local in_progress = in_progress_prefix .. ARGV[i]
  if redis.call('GET', in_progress) == marker then
    redis.call('PSETEX', in_progress, in_progress_ttl, '1')
    confirmed[#confirmed + 1] = 1
  else
    confirmed[#confirmed + 1] = 0
  end
end
return confirmed
