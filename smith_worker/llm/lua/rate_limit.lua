-- The fleet-wide rate limit of one model endpoint (smith_worker/llm/rate_limit.py; docs/architecture.md,
-- Model rate limits): GCRA, the generic cell rate algorithm (ITU-T I.371), over requests and over tokens,
-- and the pause a 429 with Retry-After started (RFC 9110 §10.2.3).
-- Times are milliseconds of the Redis server's clock (TIME), so every worker measures against one clock.
-- KEYS[1]: the endpoint's hash (Keys.llm_rate_limit): `requests` and `tokens`, the theoretical arrival times
-- (TAT) of the two limits, and `paused`, the end of a pause. Its TTL ends when the latest of them has passed:
-- a TAT or a pause in the past says nothing more than an absent one.
-- ARGV[1] = 'take': ARGV[2] requests per minute (0: no limit), ARGV[3] tokens per minute (0: no limit),
--   ARGV[4] the burst (ms of the allowance spendable at once), ARGV[5] the request's estimated tokens,
--   ARGV[6] tokens to add for earlier requests of this worker (their usage minus their estimate; may be < 0),
--   ARGV[7] the longest wait (ms) the caller accepts for a reservation (0 or absent: none).
--   Returns {0, ''} when one request and its tokens were taken; {wait_ms, 'rate_limit', 1} when they were
--   reserved, to be used after wait_ms (at most ARGV[7]): the caller sleeps and sends without asking again, so
--   waiters go in the order they asked, each told its real wait (a reservation, as Go's rate.Limiter's
--   Reserve); else {wait_ms, reason} and nothing is taken (the correction is kept): reason 'retry_after'
--   while paused (every waiter asks again when the pause ends), 'rate_limit' for a wait over ARGV[7].
-- ARGV[1] = 'pause': ARGV[2] the pause (ms) from now; a pause that ends later stays. Returns {wait_ms, 'retry_after'}.
-- ARGV[1] = 'paused': returns {ms left of the pause (0: none), 'retry_after'} (a reservation whose time came
--   waits for a pause stored meanwhile).
local key = KEYS[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local MINUTE = 60000
local state = redis.call('HMGET', key, 'requests', 'tokens', 'paused')
local paused = tonumber(state[3]) or 0

-- Store `fields` (name, value pairs) and keep the hash until its latest time has passed.
local function store(fields)
  local latest = paused
  local args = {}
  for name, value in pairs(fields) do
    table.insert(args, name)
    table.insert(args, string.format('%.3f', value))
  end
  redis.call('HSET', key, unpack(args))
  for _, value in ipairs(redis.call('HMGET', key, 'requests', 'tokens', 'paused')) do
    latest = math.max(latest, tonumber(value) or 0)
  end
  redis.call('PEXPIRE', key, math.max(math.ceil(latest - now), 1))
end

if ARGV[1] == 'pause' then
  local ends = now + tonumber(ARGV[2])
  if ends > paused then
    paused = ends
    store({paused = ends})
  end
  return {math.ceil(paused - now), 'retry_after'}
end

if paused > now or ARGV[1] == 'paused' then
  return {math.max(math.ceil(paused - now), 0), 'retry_after'}
end
local rpm, tpm, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens, correction = math.max(tonumber(ARGV[5]), 0), tonumber(ARGV[6])

-- One limit: taking `cost` units of `interval` ms each from a bucket whose TAT is `tat` (false: none) gives
-- the new TAT and the wait before it may be taken (<= 0: now). An empty bucket (TAT <= now) always grants,
-- so a request costing more than the burst still goes, alone.
local function gcra(tat, interval, cost)
  tat = math.max(tat or now, now)
  return tat + cost * interval, tat - now - math.max(burst - cost * interval, 0)
end

local wait, taken, corrected = 0, {}, nil
if rpm > 0 then
  local tat, needs = gcra(tonumber(state[1]), MINUTE / rpm, 1)
  taken.requests, wait = tat, math.max(wait, needs)
end
if tpm > 0 then
  local interval = MINUTE / tpm
  local tat = tonumber(state[2])
  if tat and correction ~= 0 then
    corrected = math.max(tat + correction * interval, now)
    tat = corrected
  end
  local after, needs = gcra(tat, interval, tokens)
  taken.tokens, wait = after, math.max(wait, needs)
end
if wait > 0 then
  if wait <= (tonumber(ARGV[7]) or 0) then
    store(taken)
    return {math.ceil(wait), 'rate_limit', 1}
  end
  if corrected then
    store({tokens = corrected})
  end
  return {math.ceil(wait), 'rate_limit'}
end
if next(taken) then
  store(taken)
end
return {0, ''}
