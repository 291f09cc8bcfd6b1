-- leader.lua: take or renew the poller's leader lease, or give it up.
-- KEYS[1] leader key. ARGV[1] candidate id, ARGV[2] ttl (ms), ARGV[3] 'acquire' | 'release'.
-- Returns 1 when the caller holds the lease afterwards (acquire) or released it (release).
local holder = redis.call('GET', KEYS[1])
if ARGV[3] == 'release' then
  if holder == ARGV[1] then redis.call('DEL', KEYS[1]); return 1 end
  return 0
end
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
