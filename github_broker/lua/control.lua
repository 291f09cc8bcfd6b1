-- control.lua: a maintainer's action on one repository's running work. One call per action;
-- each appends to the audit log the outcome that really happened.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] action, ARGV[3] actor (who asked), ARGV[4] target
-- (issue number, or agent id for the agent actions, '' for the repository), ARGV[5] reason
-- ('' none), ARGV[6..] the action's own arguments:
--   revoke     n: ARGV[6] '1' to hold the issue for a person instead of returning it
--   reassign   n: ARGV[6] the agent that continues the task (its next request gets it)
--   note       n: the reason is the note, delivered with the holder's next heartbeat
--   retry      n: clears the failure budget, usage, a hold, a budget pause, needs-human
--   pause_agent / stop_agent / resume_agent  agent (stop: its lease here is revoked now)
--   pause_repo / resume_repo: ARGV[6] scope ('repo' or 'broker')
--   no_pr      n (the broker's own): a development task completed with no PR; ARGV[6] the
--              agent that did it, ARGV[7] '1' when its branch has commits (the issue waits
--              on a person) else '' (needs-review removed, a failed attempt, back in the pool)
-- Agent actions and the broker-wide pause are audited by the caller, once for the deployment
-- (store/control.py); what they did in this repository (a stopped agent's lease) here.
-- Returns {outcome in words, agent concerned or '', '1' when the issue must be indexed again
-- from its cache (retry after the failure budget dropped its tasks) else ''}.
local C = context()
local action, actor, target, reason = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = now_ms()
local n = target

-- The live lease of issue n: its fields, or nil.
local function live(m)
  if redis.call('EXISTS', C.lock .. m) == 0 then return nil end
  local h = lease_fields(C, m)
  if not h[1] then return nil end
  return h
end

local function said(text)
  if reason ~= '' then return text .. ': ' .. reason end
  return text
end

-- Every task the issue has back in the pool (unless a lease holds it or it is parked).
local function requeue(m)
  local any = false
  for _, kind in ipairs({'fix', 'review', 'development'}) do
    if make_ready(C.K.tasks, C.K.ready, C.ready_role, kind .. ':' .. m) then any = true end
  end
  if any then redis.call('PUBLISH', C.events, 'ready') end
  return any
end

local function unready_all(m)
  for _, kind in ipairs({'fix', 'review', 'development'}) do
    unready(C.K.tasks, C.K.ready, C.ready_role, kind .. ':' .. m)
  end
end

-- Audited here, with the issue concerned (`n`, '' for the repository itself).
local function done(outcome, agent, reindex)
  audit(C, actor, action, n, agent or '', reason, outcome)
  publish_index(C)
  return {outcome, agent or '', reindex and '1' or ''}
end

if action == 'revoke' then
  local h = live(n)
  local hold = ARGV[6] == '1'
  local outcome, agent = 'no live lease on #' .. n, nil
  if h then
    agent = h[1]
    end_lease(C, n, 'revoked', now, true, h, nil, said('revoked by ' .. actor))
    outcome = 'lease of ' .. agent .. ' revoked'
  end
  if hold then
    unready_all(n)
    wait_for_person(C, n, 'held', said('held by ' .. actor), now)
    outcome = outcome .. '; #' .. n .. ' held for a person'
  elseif h and not PARKED[waiting_code(C, n) or ''] then
    requeue(n)
    outcome = outcome .. '; task back in the pool'
  end
  return done(outcome, agent)

elseif action == 'reassign' then
  local to = ARGV[6]
  if agent_pause(C, to) then return done('refused: ' .. to .. ' is paused', to) end
  local h = live(n)
  local task_id, from, note, progress = nil, '', '', ''
  if h then
    if h[1] == to then return done('refused: ' .. to .. ' holds it already', to) end
    task_id, from = h[3], h[1]
    local f = redis.call('HMGET', C.lease .. n, 'note', 'progress')
    note, progress = f[1] or '', f[2] or ''
    end_lease(C, n, 'revoked', now, true, h, nil, said('reassigned to ' .. to .. ' by ' .. actor))
  else
    for _, kind in ipairs({'fix', 'review', 'development'}) do
      if not task_id and redis.call('HEXISTS', C.K.tasks, kind .. ':' .. n) == 1 then
        task_id = kind .. ':' .. n
      end
    end
    if not task_id then return done('refused: #' .. n .. ' has no task to reassign', to) end
  end
  -- A reassignment waiting for `to` elsewhere in this repository goes back to the pool.
  local old = redis.call('GET', C.reserved .. to)
  if old then
    local m = tostring(cjson.decode(old).n)
    redis.call('ZREM', C.reservations, m)
    if m ~= n then requeue(m) end
  end
  local record = cjson.encode({task_id = task_id, n = tonumber(n), from = from, by = actor,
    reason = reason, note = note, progress = progress, at_ms = now})
  redis.call('SET', C.reserved .. to, record, 'PX', C.lease_ms_arg)
  redis.call('ZADD', C.reservations, arg(now + C.lease_ms), n)
  end_wait(C, n)
  unready_all(n)
  -- A long-polling `to` wakes up and claims it.
  redis.call('PUBLISH', C.events, 'ready')
  local outcome = string.match(task_id, '^[^:]+') .. ' task reserved for ' .. to
    .. ' (its next request-task)'
  if from ~= '' then outcome = outcome .. '; lease of ' .. from .. ' revoked' end
  return done(outcome, to)

elseif action == 'note' then
  local h = live(n)
  if not h then return done('not delivered: no live lease on #' .. n, nil) end
  local notes = cjson.decode(redis.call('HGET', C.lease .. n, 'notes') or '[]')
  if #notes >= 20 then table.remove(notes, 1) end
  notes[#notes + 1] = {by = actor, text = reason, at_ms = now}
  redis.call('HSET', C.lease .. n, 'notes', cjson.encode(notes))
  return done('queued for the next heartbeat of ' .. h[1], h[1])

elseif action == 'retry' then
  local parts = {}
  local waited = end_wait(C, n)
  if waited then parts[#parts + 1] = 'no longer waiting (' .. waited .. ')' end
  if redis.call('HDEL', C.task_failures, n) == 1 then parts[#parts + 1] = 'failures cleared' end
  if redis.call('HDEL', C.usage, n) == 1 then parts[#parts + 1] = 'usage cleared' end
  local state_key = C.review_state .. n
  if redis.call('HGET', state_key, 'needs_human') == '1' then
    redis.call('HDEL', state_key, 'needs_human', 'fix_rounds')
    parts[#parts + 1] = 'fix rounds cleared'
  end
  local skipped = redis.call('HGET', C.K.skipped, n) or ''
  local gave_up = string.find(skipped, '"too_many_failures"', 1, true) ~= nil
  if gave_up then redis.call('HDEL', C.K.skipped, n) end
  local cached = redis.call('GET', C.issue .. n)
  local labelled = false
  if cached then labelled = set_of(cjson.decode(cached).labels)[C.needs_human] == true end
  local raw_intent = redis.call('HGET', C.K.intent, n)
  if raw_intent then
    local adds = intent_sets(raw_intent)
    labelled = labelled or adds[C.needs_human] == true
  end
  if labelled or waited == 'needs_human' then
    want_labels(C.K.intent, C.K.outbox, n, {}, {C.needs_human}, now)
    parts[#parts + 1] = C.needs_human .. ' removal queued'
  end
  if waited == 'no_pr' then
    -- Back to development: the agent pushed but opened no PR; another round starts over.
    want_labels(C.K.intent, C.K.outbox, n, {}, {C.needs_review}, now)
    redis.call('SREM', C.K.reviewing, n)
    redis.call('DEL', C.review .. n, C.review_state .. n)
    parts[#parts + 1] = C.needs_review .. ' removal queued'
    labelled = true
  end
  local h = live(n)
  if h and redis.call('HDEL', C.lease .. n, 'paused') == 1 then
    -- Its wall-clock budget counts from the retry on.
    redis.call('HSET', C.lease .. n, 'budget_since_ms', arg(now))
    parts[#parts + 1] = 'task of ' .. h[1] .. ' resumed'
  elseif not h and requeue(n) then
    parts[#parts + 1] = 'back in the pool'
  end
  if #parts == 0 then return done('nothing to retry on #' .. n, h and h[1]) end
  return done(table.concat(parts, '; '), h and h[1], gave_up or labelled)

elseif action == 'no_pr' then
  -- The broker's own: a development task completed with no PR after the grace (reviews.py).
  local agent = ARGV[6]
  if redis.call('SISMEMBER', C.K.reviewing, n) == 0 then
    return done('nothing to do: #' .. n .. ' is not in review', agent)
  end
  if ARGV[7] == '1' then
    wait_for_person(C, n, 'no_pr', reason .. ': open a PR for it, or retry it', now)
    return done('waits on a person: ' .. reason, agent)
  end
  want_labels(C.K.intent, C.K.outbox, n, {}, {C.needs_review}, now)
  redis.call('SREM', C.K.reviewing, n)
  redis.call('DEL', C.review .. n, C.review_state .. n)
  drop_task(C, 'review:' .. n)
  drop_task(C, 'fix:' .. n)
  end_wait(C, n)
  local gave_up = agent ~= '' and count_failure(C, n, agent, 'no_pr', now)
  timeline(C, 'no_pr', n, agent, reason)
  if gave_up then
    want_labels(C.K.intent, C.K.outbox, n, {C.needs_human}, {}, now)
    return done(C.needs_review .. ' removed; attempt counted; labelled ' .. C.needs_human, agent)
  end
  return done(C.needs_review .. ' removed; attempt counted; back in the pool', agent, true)

elseif action == 'pause_agent' or action == 'stop_agent' then
  local agent = target
  local kind = 'pause'
  if action == 'stop_agent' then kind = 'stop' end
  redis.call('HSET', C.paused_agents, agent, cjson.encode({kind = kind, by = actor,
    reason = reason, at_ms = now}))
  if kind == 'pause' then return {'paused', agent, ''} end
  local m = redis.call('GET', C.agent .. agent)
  local h = m and live(m)
  if not h or h[1] ~= agent then return {'paused; no live lease here', agent, ''} end
  end_lease(C, m, 'revoked', now, true, h, true, said('agent stopped by ' .. actor))
  if not PARKED[waiting_code(C, m) or ''] then requeue(m) end
  publish_index(C)
  -- Audited once, by the caller, for the deployment (its outcome names this lease).
  return {'lease on #' .. m .. ' revoked; task back in the pool', agent, ''}

elseif action == 'resume_agent' then
  local agent = target
  redis.call('HDEL', C.paused_agents, agent)
  redis.call('HDEL', C.agent_streaks, agent)
  redis.call('HDEL', C.streak_first, agent)
  redis.call('HDEL', C.instant_failures, agent)
  return {'resumed', agent, ''}

elseif action == 'pause_repo' then
  n = ''
  redis.call('HSET', C.control, ARGV[6], cjson.encode({scope = ARGV[6], by = actor,
    reason = reason, at_ms = now}))
  if ARGV[6] == 'broker' then return {'paused', '', ''} end
  return done('paused: nothing new is handed out here; leases keep running', nil)

elseif action == 'resume_repo' then
  n = ''
  redis.call('HDEL', C.control, ARGV[6])
  if redis.call('ZCARD', C.K.ready) > 0 then redis.call('PUBLISH', C.events, 'ready') end
  if ARGV[6] == 'broker' then return {'resumed', '', ''} end
  return done('resumed', nil)
end
return redis.error_reply('ERR unknown control action ' .. action)
