-- Shared by every script: the loader (smith_client/scripts.py) puts this file before each one.
-- Field names of a turn's state hash are those of smith_client/turn_record.py.

-- The statuses after which a turn changes no more.
local TERMINAL = {completed = true, failed = true, cancelled = true}

-- Count how a running attempt of the turn whose state hash is `state` ended without ending the turn
-- (its worker died, or lost Redis past its lease): a crash of the turn when its worker ran it alone,
-- otherwise a shared crash (smith_worker/turn/lifecycle.py, the attempt limit). `worker_turns` is that worker's
-- SET of running turns (false: unknown, taken as alone); it keeps them after the worker died.
local function count_crash(state, worker_turns)
  if not worker_turns or redis.call('SCARD', worker_turns) <= 1 then
    redis.call('HINCRBY', state, 'crashes', 1)
  else
    redis.call('HINCRBY', state, 'shared_crashes', 1)
  end
end

-- Walk a conversation's FIFO of turn ids (oldest first) up to `stop_at` (or its end),
-- dropping the turns that are no longer in `statuses`, the conversation's hash of
-- unfinished turns (turn id -> status), which the scripts that end a turn update.
-- Returns the unfinished ids, oldest first.
local function unfinished_turns(fifo, statuses, stop_at)
  local active = {}
  for _, id in ipairs(redis.call('LRANGE', fifo, 0, -1)) do
    if id == stop_at then break end
    if redis.call('HEXISTS', statuses, id) == 0 then
      redis.call('LREM', fifo, 0, id)
    else
      table.insert(active, id)
    end
  end
  return active
end

-- Drop the oldest messages of `history` beyond `max`, moving the cut forward past tool messages so
-- a tool-call group goes whole; count what was removed in `trimmed` and give it the history's TTL
-- (positions depend on it; smith_worker/memory/history.py).
local function trim(history, trimmed, max, ttl)
  redis.call('EXPIRE', trimmed, ttl)
  local len = redis.call('LLEN', history)
  local cut = len - tonumber(max)
  if cut <= 0 then return end
  while cut < len and cjson.decode(redis.call('LINDEX', history, cut))['role'] == 'tool' do
    cut = cut + 1
  end
  redis.call('LTRIM', history, cut, -1)
  redis.call('INCRBY', trimmed, cut)
  redis.call('EXPIRE', trimmed, ttl)
end

-- The history's absolute end: messages ever appended (the trimmed ones counted), smith_worker/memory/history.py.
local function history_end(history, trimmed)
  return tonumber(redis.call('GET', trimmed) or '0') + redis.call('LLEN', history)
end

-- Push a wake-up token for the workers of a queue, which block on the list instead of polling
-- (smith_worker/queue/pickup.py): a token only means "poll now", so the list is capped and expires.
local function wake(list, ttl, cap)
  redis.call('RPUSH', list, '1')
  redis.call('LTRIM', list, -tonumber(cap), -1)
  redis.call('EXPIRE', list, ttl)
end

-- The capability sets of a queue's live workers that hold `need` (smith_worker/routing.py), and how many
-- sets are live. `capsets` is the queue's ZSET of live sets (digest -> expiry ms), `caps_prefix` the prefix
-- of a set's key (Keys.capability_prefixes).
local function serving_sets(capsets, caps_prefix, need, now)
  local live = redis.call('ZRANGEBYSCORE', capsets, now, '+inf')
  local serving = {}
  for _, digest in ipairs(live) do
    if redis.call('SISMEMBER', caps_prefix .. digest, need) == 1 then serving[#serving + 1] = digest end
  end
  return serving, #live
end

-- arq's enqueue_job (smith_client/enqueue.py): the job record (arq's serializer), the queue entry and
-- a wake-up token; nothing when arq already has the job id queued, running or holding a result.
-- A job that needs something (`need`, '' for nothing) is listed in the queue's requirements hash, so
-- only a worker whose capability set holds it claims it (claim.lua); its token goes to the queue's list
-- when every live set serves it (or none is live: the job waits for a worker), else to the list of each
-- set that does, so no worker that cannot run it takes its token. With `refuse` '1', a job that live sets
-- exist for but none serves is not enqueued.
-- A turn job with `fair` '1' is not put on the queue itself but on its tenant's waiting ZSET
-- (Keys.tenant_waiting), and the tenant joins the ring of tenants with waiting work (Keys.tenant_ring) at
-- the lowest pass there, so it takes its turn with the others from now on (start-time fair queuing): the
-- claim (claim.lua) admits each tenant's jobs to the queue in that order (docs/architecture.md, Fair pickup).
-- k: arq job key, arq result key, queue, wake-up list, requirements hash, capability sets ZSET.
-- a: job expiry ms, job bytes, score ms, job id, wake-up list TTL s, wake-up list cap, need, refuse
--    ('1'/'0'), now ms, the prefixes of a capability set's key and of its wake-up list, then fair ('1'/'0'),
--    the tenant ('' for none), the prefix of a tenant's waiting ZSET and the ring's key (ENQUEUE_ARGC in all).
-- Returns 1 when enqueued, 0 when arq has the job id, -2 when refused. Used by enqueue.lua and submit.lua.
local ENQUEUE_ARGC = 15

-- Put job `job_id` (score `score`) on `tenant`'s waiting ZSET, the tenant in the ring if it was not, both
-- living as long as the job's record (`expiry_ms`).
local function wait_for_admission(job_id, score, tenant, waiting_prefix, ring, expiry_ms)
  local waiting = waiting_prefix .. tenant
  redis.call('ZADD', waiting, score, job_id)
  -- GT: a tenant already waiting keeps its pass (never below the lowest); a new one (or one left behind by
  -- expired jobs) gets the lowest
  redis.call('ZADD', ring, 'GT', redis.call('ZRANGE', ring, 0, 0, 'WITHSCORES')[2] or 0, tenant)
  for _, key in ipairs({waiting, ring}) do
    if redis.call('PTTL', key) < tonumber(expiry_ms) then redis.call('PEXPIRE', key, expiry_ms) end
  end
end

local function enqueue_job(k, a)
  local job_key, result_key, queue, wake_list, requirements, capsets = unpack(k)
  local expiry_ms, job, score, job_id, wake_ttl, wake_cap, need, refuse, now, caps_prefix, wake_prefix = unpack(a, 1, 11)
  local fair, tenant, waiting_prefix, ring = unpack(a, 12, ENQUEUE_ARGC)
  if redis.call('EXISTS', job_key, result_key) > 0 then return 0 end
  local lists = {wake_list}
  if need ~= '' then
    local serving, live = serving_sets(capsets, caps_prefix, need, now)
    if #serving == 0 and live > 0 and refuse == '1' then return -2 end
    local routed = #serving > 0 and #serving < live
    if routed then
      lists = {}
      for i, digest in ipairs(serving) do lists[i] = wake_prefix .. digest end
    end
    redis.call('HSET', requirements, job_id, (routed and '@' or '*') .. need)
    if redis.call('PTTL', requirements) < tonumber(expiry_ms) then redis.call('PEXPIRE', requirements, expiry_ms) end
  end
  redis.call('PSETEX', job_key, expiry_ms, job)
  if fair == '1' then
    wait_for_admission(job_id, score, tenant, waiting_prefix, ring, expiry_ms)
  else
    redis.call('ZADD', queue, score, job_id)
  end
  for _, list in ipairs(lists) do wake(list, wake_ttl, wake_cap) end
  return 1
end

-- True when a publish fenced by the turn's `state` is dropped: the turn is not running, or `attempt`
-- (unless '') is not its current attempt (publish.lua, publish_batch.lua).
local function fenced_off(state, attempt)
  return redis.call('HGET', state, 'status') ~= 'running'
         or (attempt ~= '' and redis.call('HGET', state, 'attempt') ~= attempt)
end

-- The start of an event's JSON: its `seq`, then its `ts` (epoch seconds with microseconds) from the Redis
-- server's clock (TIME), so the events of a turn's log have non-decreasing ts in seq order, whichever process
-- built them and whenever (docs/architecture.md, Events). The caller's body follows after the comma.
local function event_head(seq, now)
  return string.format('{"seq":%d,"ts":%s.%06d,', seq, now[1], tonumber(now[2]))
end

-- Publish one event of a turn (publish.lua has the contract; store_tool_result.lua publishes with it too):
-- `state` and `once` may be nil, `attempt` is only read with `state`. Returns the seq, -1 when fenced off,
-- 0 when `once` was set already.
-- The command publishing a turn's event on `channel`: on Redis Cluster, where every name starts with the prefix's
-- hash tag (smith_client/keys.py, Keys.key_prefix), sharded pub/sub, delivered within the slot's master and its
-- replicas instead of to every node of the cluster (docs/cluster.md, Pub/sub; Redis 7); PUBLISH elsewhere.
local function publish_command(channel)
  if string.sub(channel, 1, 1) == '{' then return 'SPUBLISH' end
  return 'PUBLISH'
end

local function publish_event(seq_key, log, channel, state, once, body, max_len, ttl, attempt)
  if state and fenced_off(state, attempt) then return -1 end
  if once then
    if redis.call('EXISTS', once) == 1 then return 0 end
    redis.call('SET', once, '1', 'EX', ttl)
  end
  local seq = redis.call('INCR', seq_key)
  redis.call('EXPIRE', seq_key, ttl)
  local payload = event_head(seq, redis.call('TIME')) .. body
  redis.call('XADD', log, 'MAXLEN', '~', max_len, '0-' .. seq, 'e', payload)
  redis.call('EXPIRE', log, ttl)
  redis.call(publish_command(channel), channel, payload)
  return seq
end

-- Move the merged user messages waiting in a turn's `inbox` into its `history` (`trimmed` its trim
-- counter; kept to `max` messages, `ttl` seconds); with `closing` ('1') and none waiting, close the inbox
-- (the turn is finishing; a later merge starts a turn of its own). Returns the moved messages, or false
-- when `attempt` is not the turn's current one. drain_inbox.lua, complete.lua.
local function drain_inbox(state, inbox, history, trimmed, attempt, ttl, closing, max)
  if redis.call('HGET', state, 'attempt') ~= attempt then return false end
  local msgs = redis.call('LRANGE', inbox, 0, -1)
  if #msgs > 0 then
    redis.call('RPUSH', history, unpack(msgs))
    redis.call('EXPIRE', history, ttl)
    trim(history, trimmed, max, ttl)
    redis.call('DEL', inbox)
  elseif closing == '1' then
    redis.call('HSET', state, 'inbox_closed', '1')
  end
  return msgs
end

-- The end of an unfinished turn (finish_turn): it leaves its conversation's FIFO and hash of unfinished
-- turns and the paused ZSET; its pending calls and their decisions are deleted.
local function leave_unfinished(turn_id, fifo, statuses, pending, decisions, paused)
  redis.call('LREM', fifo, 0, turn_id)
  redis.call('HDEL', statuses, turn_id)
  redis.call('ZREM', paused, turn_id)
  redis.call('DEL', pending, decisions)
end

-- Merged user messages an ending turn did not get to are kept: moved from its `inbox` to the end of the
-- `history` (which then lives `ttl` seconds). finish_turn.
local function keep_merged(inbox, history, ttl)
  local merged = redis.call('LRANGE', inbox, 0, -1)
  if #merged > 0 then
    redis.call('RPUSH', history, unpack(merged))
    redis.call('EXPIRE', history, ttl)
  end
  redis.call('DEL', inbox)
end

-- The fenced final write of a turn's attempt (finish.lua has the contract; complete.lua).
-- k: state, running ZSET, conversation FIFO, inbox, history, conversation statuses, the worker's running
-- turns SET, pending, decisions, paused ZSET. a: turn id, attempt, status, field, value, turn TTL s, history TTL s.
-- Returns 1, or 0 when fenced off.
local function finish_turn(k, a)
  local state, running, fifo, inbox, history, statuses, worker_turns, pending, decisions, paused = unpack(k)
  local turn_id, attempt, status, field, value, turn_ttl, history_ttl = unpack(a)
  if fenced_off(state, attempt) then return 0 end
  redis.call('HSET', state, 'status', status, field, value, 'inbox_closed', '1', 'lease_until', 0)
  redis.call('EXPIRE', state, turn_ttl)
  redis.call('ZREM', running, turn_id)
  leave_unfinished(turn_id, fifo, statuses, pending, decisions, paused)
  redis.call('SREM', worker_turns, turn_id)
  keep_merged(inbox, history, history_ttl)
  return 1
end

-- A conversation's oldest unfinished turn and its status ({} if none), dropping finished ones on the way.
-- `fifo` is its FIFO of turn ids, `statuses` its hash of unfinished turns. head.lua, complete.lua.
local function conversation_head(fifo, statuses)
  local active = unfinished_turns(fifo, statuses)
  if #active == 0 then return {} end
  return {active[1], redis.call('HGET', statuses, active[1])}
end

-- A worker registration (smith_worker/ops/registration.py) at `key`, and whether the process instance
-- `instance` wrote it (its JSON's "instance"); nil, true when there is none.
local function registration(key, instance)
  local held = redis.call('GET', key)
  if not held then return nil, true end
  local ok, holder = pcall(cjson.decode, held)
  return held, ok and type(holder) == 'table' and holder['instance'] == instance
end

-- Stored limit `value` as a number in [`least`, `most`], the nearest bound when out of it (a value written by hand
-- or by an older version: docs/tenants.md, Values out of range); nil when absent or no number (its default applies).
local function bounded(value, least, most)
  local number = tonumber(value)
  if number == nil or number ~= number then return nil end
  return math.min(math.max(number, tonumber(least)), tonumber(most))
end

-- The fields of hash `key` (HMGET), or none when the key holds another type (a hand edit): the defaults apply,
-- instead of every claim or submit failing on WRONGTYPE (docs/tenants.md, Values out of range).
local function hash_fields(key, ...)
  local reply = redis.pcall('HMGET', key, ...)
  if reply.err then return {} end
  return reply
end

-- The integer stored at `key`; 0 when absent, or no number or no string (a hand edit: GET's error reply is a table).
local function stored_count(key)
  return tonumber(redis.pcall('GET', key)) or 0
end

-- The number of quota arguments (smith_client/tenants.py quota_arguments): the tenant's quota counters' prefix
-- ('' for none), the default window (s), the least and the most window (s), the most quota (tokens).
local QUOTA_ARGC = 5

-- A tenant's quota window (docs/tenants.md; smith_client/tenants.py): from its limits hash `limits` and the
-- QUOTA_ARGC arguments `args`, the counter of the window holding `now` (epoch s) -- the counters' prefix followed
-- by the window's start (epoch s) -- the window's length (s; the default when the hash sets none), its start and
-- the tenant's token quota (nil: none); stored values out of range are read as the nearest bound.
local function quota_window(limits, args, now)
  local counter_prefix, default_window, least_window, most_window, most_quota = unpack(args, 1, QUOTA_ARGC)
  local fields = hash_fields(limits, 'token_quota', 'quota_window_seconds')
  local quota, window = fields[1], fields[2]
  window = bounded(window, least_window, most_window) or tonumber(default_window)
  local start = math.floor(tonumber(now) / window) * window
  return counter_prefix .. string.format('%d', start), window, start, bounded(quota, 1, most_quota)
end

-- The tokens counted in that window, the quota (0: none) and the window's end (epoch s), then its length (s).
local function tenant_quota(limits, args, now)
  local counter, window, start, quota = quota_window(limits, args, now)
  return {stored_count(counter), quota or 0, start + window, window}
end
