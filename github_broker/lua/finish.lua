-- finish.lua: end a live lease as completed, failed or abandoned (release).
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] issue number, ARGV[3] agent id, ARGV[4] token,
-- ARGV[5] outcome: completed | failed | abandoned, ARGV[6] '0' when a failure is not the
-- agent's own (it never received the task): no failure budget is spent. ARGV[7], ARGV[8]:
-- the task type and claim time a valid signed token proves ('' none: see adopt_proven), so a
-- completion retried after Redis lost the lease still lands; ARGV[9] what the serving
-- process remembers of that lease ('live' or 'unknown').
-- Returns {1, outcome} or {0, reason} (reasons as heartbeat.lua).
local C = context()
local n, agent, token, outcome = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = now_ms()
local proof = nil
if ARGV[7] and ARGV[7] ~= '' then proof = {ARGV[7], ARGV[8], ARGV[9]} end
local refusal = lease_refusal(C, n, agent, token, now, proof)
if refusal then return {0, refusal} end
end_lease(C, n, outcome, now, ARGV[6] == '0')
publish_index(C)
return {1, outcome}
