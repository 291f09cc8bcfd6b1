-- login_attempt.lua: one dashboard login attempt of one client, whose credential was already
-- checked: refused while the client waits out its delay, else a correct one forgives the
-- client's failures and a wrong one is counted (past the free ones, a delay that doubles).
-- Only the client's own failures count: no one else's guesses ever delay a correct login.
-- KEYS[1] the client's record (hash `fails`, `until_ms`; an IPv6 client is its /64).
-- ARGV[1] now (ms), ARGV[2] `1` when the credential is correct, `0` when not, `?` to ask
-- only whether the client may try now (before a credential that costs a GitHub call),
-- ARGV[3] failures free of any delay, ARGV[4] the first delay (ms), ARGV[5] the longest delay
-- (ms), ARGV[6] how long a client's failures are remembered after its last one (ms).
-- Returns {2, ms}: refused whatever the credential, the client waits out a delay for ms more
-- (a correct credential learns nothing either); {1, 0}: let it in (`?`: it may try);
-- {0, ms}: a wrong credential, counted; ms > 0 when it starts a delay.
local now = tonumber(ARGV[1])
local until_ms = tonumber(redis.call('HGET', KEYS[1], 'until_ms') or '0')
if now < until_ms then
  return {2, until_ms - now}
end
if ARGV[2] == '?' then
  return {1, 0}
end
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
  return {1, 0}
end
local fails = redis.call('HINCRBY', KEYS[1], 'fails', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
-- The first failure past the free ones waits the first delay; each further one twice as long.
local over = fails - tonumber(ARGV[3]) - 1
if over < 0 then
  return {0, 0}
end
-- 2^over steps, bounded before the power so a long history never overflows.
local delay = tonumber(ARGV[5])
if over < 30 then
  delay = math.floor(math.min(delay, tonumber(ARGV[4]) * (2 ^ over)))
end
redis.call('HSET', KEYS[1], 'until_ms', now + delay)
return {0, delay}
