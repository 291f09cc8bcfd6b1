-- Release a short mutex (an agent's `agent_busy`) only if it still holds this caller's token:
-- a request whose hold ran out must not release the next request's mutex.
-- KEYS[1] the mutex, ARGV[1] the token; returns 1 if it deleted it.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
