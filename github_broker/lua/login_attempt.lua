-- login_attempt.lua: count one dashboard login attempt, or refuse it while a window is full.
-- KEYS[1] the client's attempts, KEYS[2] every client's attempts (one Cluster slot: both
-- carry the `{<prefix>:ui}` hash tag).
-- ARGV[1] the window (ms), ARGV[2] attempts a client may make in it, ARGV[3] attempts all
-- clients together may make in it.
-- Attempts are counted before the token is checked, so concurrent guesses cannot slip past
-- the limit; a refused attempt is not counted (the window ends when it began + ARGV[1]).
-- Returns {1, 0} when the attempt may go on, {0, ms until the window ends} when refused.
local function full(key, limit)
  local n = tonumber(redis.call('GET', key) or '0')
  if n < tonumber(limit) then
    return nil
  end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then -- never a counter without an end
    redis.call('PEXPIRE', key, ARGV[1])
    ttl = tonumber(ARGV[1])
  end
  return ttl
end
local wait = full(KEYS[1], ARGV[2]) or full(KEYS[2], ARGV[3])
if wait then
  return {0, wait}
end
for i = 1, 2 do
  if redis.call('INCR', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
  end
end
return {1, 0}
