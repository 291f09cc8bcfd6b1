-- leader.lua: take or renew the poller's leader lease, or give it up.
-- KEYS[1] leader key, KEYS[2] leader epoch key (same Cluster slot: a hash tag on KEYS[1]).
-- ARGV[1] candidate id, ARGV[2] ttl (ms), ARGV[3] 'acquire' | 'release'.
-- acquire returns the caller's leader epoch (> 0) when it holds the lease afterwards, else 0.
-- Every change of hands hands out a new, higher epoch: max(last + 1, server time in µs), so it
-- keeps growing even after Redis lost the epoch key (FLUSHALL, failover without persistence).
-- release returns 1 when the caller held the lease and gave it up, else 0.
local holder = redis.call('GET', KEYS[1])
if ARGV[3] == 'release' then
  if holder == ARGV[1] then redis.call('DEL', KEYS[1]); return 1 end
  return 0
end
if holder == ARGV[1] then
  local epoch = tonumber(redis.call('GET', KEYS[2]))
  if epoch then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return epoch
  end
  holder = false -- the epoch was lost with the rest of Redis: take the lease anew
end
if holder == false then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local epoch = math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, now)
  redis.call('SET', KEYS[2], string.format('%d', epoch))
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return epoch
end
return 0
