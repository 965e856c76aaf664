-- Append a skill name to a conversation's active skills unless present (an activation keeps its
-- first position) and refresh the TTL. KEYS: the skills list. ARGV: name, TTL s. Returns 1 if added.
local added = 0
if redis.call('LPOS', KEYS[1], ARGV[1]) == false then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  added = 1
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return added
