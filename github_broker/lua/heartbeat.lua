-- heartbeat.lua: extend a live lease and the agent's current-task key.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] issue number, ARGV[3] agent id, ARGV[4] token.
-- Returns {1, expires_ms} or {0, reason}: expired | revoked | not_owner | issue_closed |
-- label_removed | completed | failed | abandoned.
local C = context()
local n, agent, token = ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
local refusal = lease_refusal(C, n, agent, token, now)
if refusal then return {0, refusal} end
local expires = now + C.lease_ms
local expires_arg = arg(expires)
redis.call('PEXPIRE', C.lock .. n, C.lease_ms_arg)
redis.call('HSET', C.lease .. n, 'expires_ms', expires_arg)
redis.call('ZADD', C.K.leases, expires_arg, n)
redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s_arg)
return {1, expires}
