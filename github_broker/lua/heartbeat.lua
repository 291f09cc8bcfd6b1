-- heartbeat.lua: extend a live lease and the agent's current-task key; record what the agent
-- reports; hand it what happened since its last heartbeat.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] issue number, ARGV[3] agent id, ARGV[4] token,
-- ARGV[5] the agent's progress note ('' none), ARGV[6] tokens and ARGV[7] cost the agent
-- reports for this attempt so far ('' none; cumulative, so a retried report counts once),
-- ARGV[8] and ARGV[9] the task type and claim time a valid signed token proves ('' none: see
-- adopt_proven), ARGV[10] what the serving process remembers of that lease ('live' or
-- 'unknown').
-- A note that differs from the last one is progress (the agent's word, a second source
-- beside what GitHub shows: see progress.lua). Usage is summed per issue across attempts
-- (`usage`, counted again from a retry); at budget_tokens or budget_cost (or the issue's own,
-- raised by a retry) the task is set aside for a person (the lease
-- lives on, the agent is told `paused`, the issue waits on a person: waiting_for_user).
-- Maintainers' notes queued for the agent are delivered once, here.
-- Returns {1, expires_ms, JSON {state, notes, paused, agent_paused}} or {0, reason}:
-- expired | revoked[|detail] | not_owner | issue_closed | label_removed | completed |
-- failed | abandoned | not_leased.
local C = context()
local n, agent, token = ARGV[2], ARGV[3], ARGV[4]
local note, tokens, cost = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()
local proof = nil
if ARGV[8] and ARGV[8] ~= '' then proof = {ARGV[8], ARGV[9], ARGV[10]} end
local refusal = lease_refusal(C, n, agent, token, now, proof)
if refusal then return {0, refusal} end
local lease_key = C.lease .. n
local expires = now + C.lease_ms
local expires_arg = arg(expires)
redis.call('PEXPIRE', C.lock .. n, C.lease_ms_arg)
redis.call('HSET', lease_key, 'expires_ms', expires_arg)
redis.call('HINCRBY', lease_key, 'beats', 1)
redis.call('ZADD', C.K.leases, expires_arg, n)
redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s_arg)

local f = redis.call('HMGET', lease_key, 'note', 'used_tokens', 'used_cost', 'paused',
  'notes', 'stalled')
if note ~= '' and note ~= f[1] then
  redis.call('HSET', lease_key, 'note', note, 'note_ms', arg(now))
  record_progress(C, n, 'note', note, now)
end

local paused = f[4]
if tokens or cost then
  local total = cjson.decode(redis.call('HGET', C.usage, n) or '{"tokens":0,"cost":0}')
  if tokens and tokens > (tonumber(f[2]) or 0) then
    total.tokens = total.tokens + tokens - (tonumber(f[2]) or 0)
    redis.call('HSET', lease_key, 'used_tokens', arg(tokens))
  end
  if cost and cost > (tonumber(f[3]) or 0) then
    total.cost = total.cost + cost - (tonumber(f[3]) or 0)
    redis.call('HSET', lease_key, 'used_cost', tostring(cost))
  end
  redis.call('HSET', C.usage, n, cjson.encode(total))
  -- A retry may have raised this issue's budget (control.lua retry_usage).
  local max_tokens = tonumber(total.tokens_budget) or C.budget_tokens
  local max_cost = tonumber(total.cost_budget) or C.budget_cost
  local over = nil
  if max_tokens > 0 and total.tokens >= max_tokens then
    over = total.tokens .. ' tokens reported, budget ' .. max_tokens
  elseif max_cost > 0 and total.cost >= max_cost then
    over = 'cost ' .. total.cost .. ' reported, budget ' .. max_cost
  end
  if over and not paused then
    paused = set_aside(C, n, agent, over, now)
    publish_index(C)
  end
end

local notes = cjson.decode(f[5] or '[]')
if f[5] then
  redis.call('HDEL', lease_key, 'notes')
  timeline(C, 'note_delivered', n, agent, #notes .. ' note(s)')
end
local state = 'in_progress'
if paused then
  state = 'waiting_for_user'
elseif f[6] then
  state = 'idle'
end
-- Absent fields are nil (cjson drops them): no notes, not paused.
local answer = {state = state}
if #notes > 0 then answer.notes = notes end
if paused then answer.paused = cjson.decode(paused) end
local agent_paused = agent_pause(C, agent)
if agent_paused then answer.agent_paused = cjson.decode(agent_paused) end
return {1, expires, cjson.encode(answer)}
