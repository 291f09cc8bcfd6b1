-- control.lua: a maintainer's action on one repository's running work. One call per action;
-- each appends to the audit log the outcome that really happened.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] action, ARGV[3] actor ('<rank>:<name>', see
-- parse_actor; a bare name is the broker's own), ARGV[4] target
-- (issue number, or agent id for the agent actions, '' for the repository), ARGV[5] reason
-- ('' none), ARGV[6..] the action's own arguments:
--   revoke     n: ARGV[6] '1' to hold the issue for a person instead of returning it
--   reassign   n: ARGV[6] the agent that continues the task (its next request gets it)
--   note       n: the reason is the note, delivered with the holder's next heartbeat
--   retry      n: clears the failure budget, usage, a hold, a budget pause, needs-human
--   pause_agent / stop_agent / resume_agent  agent; ARGV[6] scope ('deployment' when the
--              action covers every repository, 'repo' when only some): stop revokes its
--              lease here now; a pause of a higher authority stays (lift_refusal)
--   pause_repo / resume_repo: ARGV[6] scope ('repo' or 'broker')
--   no_pr      n (the broker's own): a development task completed with no PR; ARGV[6] the
--              agent that did it, ARGV[7] '1' when its branch has commits (the issue waits
--              on a person) else '' (needs-review removed, a failed attempt, back in the pool)
--   recovered  n (the broker's own, leader/): issue n waited `recovering` (a lease rebuilt
--              from labels after a loss, never proved), or ARGV[8] 'linked': a rebuild after a
--              loss found an open PR for its development task (its claim's labels never
--              reached GitHub); ARGV[6] the agent ('' unknown), ARGV[7] '1' when GitHub shows a
--              PR for it (completed: in review) else '' (back to the pool)
-- Agent actions and the broker-wide pause are audited by the caller, once for the deployment
-- (store/control.py); what they did in this repository (a stopped agent's lease) here.
-- Returns {outcome in words, agent concerned or '', '1' when the issue must be indexed again
-- from its cache (retry after the failure budget dropped its tasks) else '', the agent a person
-- took the issue from and until when it is kept from it ('<agent>|<ms>', '' none)}.
local C = context()
local action, target, reason = ARGV[2], ARGV[4], ARGV[5]
local rank, actor = parse_actor(ARGV[3])
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

-- Audited here, with the issue concerned (`n`, '' for the repository itself); `ended`: the
-- action ended a lease (its task is then `cancelled` for that agent).
local ended = nil
-- `kept`: the agent a person just took issue n from (keep_away), '' none.
local kept = ''
local function done(outcome, agent, reindex)
  audit(C, actor, action, n, agent or '', reason, outcome, rank, ended)
  publish_index(C)
  return {outcome, agent or '', reindex and '1' or '', kept}
end

-- A person took issue m from `agent`: it is not handed m again for keep_away_ms, or until a
-- retry (kept_away lists whom a retry lets back). Returns the outcome's words.
local KEPT_AWAY_MAX = 20
local function keep_away(agent, m)
  if C.keep_away_ms <= 0 then return '' end
  cool_down(C, agent, m, now + C.keep_away_ms, now)
  kept = agent .. '|' .. arg(now + C.keep_away_ms)
  local list = cjson.decode(redis.call('HGET', C.kept_away, m) or '[]')
  if not list_find(list, agent) then
    if #list >= KEPT_AWAY_MAX then table.remove(list, 1) end
    list[#list + 1] = agent
  end
  redis.call('HSET', C.kept_away, m, cjson.encode(list))
  return '; ' .. agent .. ' is not handed #' .. m .. ' again until a retry'
end

-- The decisions on issue n that a retry lifts, with the highest rank among them: a waiting
-- entry (held, a budget, needs-human), a live lease set aside at its budget, the failure
-- budget spent. Nil when there is none.
local function strongest_decision(h)
  local best = nil
  local raw = redis.call('HGET', C.waiting, n)
  if raw then
    local w = cjson.decode(raw)
    if w.code ~= 'awaiting_feedback' then
      w.rank = tonumber(w.rank) or BROKER_RANK
      best = w
    end
  end
  local by_broker = (h and redis.call('HEXISTS', C.lease .. n, 'paused') == 1)
    or redis.call('HEXISTS', C.task_failures, n) == 1
  if by_broker and not best then
    best = {what = 'set aside by the failure or usage budget', by = 'broker', rank = BROKER_RANK}
  end
  return best
end

-- A retry's usage budget: counted again from zero (the usage so far stays in `spent`), or,
-- with `raise` ({tokens, cost}: JSON), the issue's budget raised to that and the count kept.
-- Returns the outcome's words ('' when there was nothing to do).
local function retry_usage(raise)
  raise = raise or ''
  local raw = redis.call('HGET', C.usage, n)
  if raise ~= '' then
    local u = cjson.decode(raw or '{"tokens":0,"cost":0}')
    local r = cjson.decode(raise)
    local said_parts = {}
    if r.tokens then u.tokens_budget = r.tokens; said_parts[#said_parts + 1] = r.tokens .. ' tokens' end
    if r.cost then u.cost_budget = r.cost; said_parts[#said_parts + 1] = 'cost ' .. r.cost end
    redis.call('HSET', C.usage, n, cjson.encode(u))
    return 'budget raised to ' .. table.concat(said_parts, ', ') .. ' (' .. u.tokens
      .. ' tokens, cost ' .. u.cost .. ' used so far)'
  end
  if not raw then return '' end
  local u = cjson.decode(raw)
  if (tonumber(u.tokens) or 0) == 0 and (tonumber(u.cost) or 0) == 0 then return '' end
  redis.call('HSET', C.usage, n, cjson.encode({tokens = 0, cost = 0,
    spent_tokens = (tonumber(u.spent_tokens) or 0) + u.tokens,
    spent_cost = (tonumber(u.spent_cost) or 0) + u.cost}))
  return 'usage counted from the retry (' .. u.tokens .. ' tokens, cost ' .. u.cost .. ' before)'
end

if action == 'revoke' then
  local h = live(n)
  local hold = ARGV[6] == '1'
  local outcome, agent = 'no live lease on #' .. n, nil
  if hold then
    local cur = redis.call('HGET', C.waiting, n)
    cur = cur and cjson.decode(cur)
    if cur and cur.code == 'held' and (tonumber(cur.rank) or 4) > rank then
      return done(lift_refusal(cur, rank, 'repo'), nil)
    end
  end
  if h then
    agent = h[1]
    end_lease(C, n, 'revoked', now, true, h, nil, said('revoked by ' .. actor))
    ended = 'cancelled'
    outcome = 'lease of ' .. agent .. ' revoked' .. keep_away(agent, n)
  end
  if hold then
    unready_all(n)
    wait_for_person(C, n, 'held', said('held by ' .. actor), now, actor, rank)
    -- On GitHub too: a hold must outlive a loss of Redis's data (the sync reads the label).
    want_labels(C.K.intent, C.K.outbox, n, {C.needs_human}, {}, now)
    outcome = outcome .. '; #' .. n .. ' held for a person (labelled ' .. C.needs_human .. ')'
  elseif h and not PARKED[waiting_code(C, n) or ''] then
    requeue(n)
    outcome = outcome .. '; task back in the pool'
  end
  return done(outcome, agent)

elseif action == 'reassign' then
  local to = ARGV[6]
  if agent_pause(C, to) then return done('refused: ' .. to .. ' is paused', to) end
  -- A reassignment of a higher authority waiting for its agent stays.
  local prior = redis.call('HGET', C.reserved_issues, n)
  if prior and redis.call('ZSCORE', C.reservations, n) then
    prior = cjson.decode(prior)
    if (tonumber(prior.rank) or 4) > rank then return done(lift_refusal(prior, rank, 'repo'), to) end
  end
  local h = live(n)
  local task_id, from, note, progress = nil, '', '', ''
  if h then
    if h[1] == to then return done('refused: ' .. to .. ' holds it already', to) end
    task_id, from = h[3], h[1]
    local f = redis.call('HMGET', C.lease .. n, 'note', 'progress')
    note, progress = f[1] or '', f[2] or ''
    end_lease(C, n, 'revoked', now, true, h, nil, said('reassigned to ' .. to .. ' by ' .. actor))
    ended = 'cancelled'
    keep_away(from, n)
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
    redis.call('HDEL', C.reserved_issues, m)
    if m ~= n then requeue(m) end
  end
  local record = cjson.encode({task_id = task_id, n = tonumber(n), from = from, by = actor,
    rank = rank, what = 'reassigned to ' .. to, reason = reason, note = note,
    progress = progress, at_ms = now})
  redis.call('SET', C.reserved .. to, record, 'PX', C.lease_ms_arg)
  redis.call('HSET', C.reserved_issues, n, record)
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
  local h = live(n)
  local decided = strongest_decision(h)
  if decided and rank < decided.rank then
    return done(lift_refusal(decided, rank, 'repo'), h and h[1])
  end
  local parts = {}
  local waited = end_wait(C, n)
  if waited then parts[#parts + 1] = 'no longer waiting (' .. waited .. ')' end
  if redis.call('HDEL', C.task_failures, n) == 1 then parts[#parts + 1] = 'failures cleared' end
  local kept = redis.call('HGET', C.kept_away, n)
  if kept then
    for _, a in ipairs(cjson.decode(kept)) do redis.call('ZREM', C.cooldowns .. a, n) end
    redis.call('HDEL', C.kept_away, n)
    parts[#parts + 1] = 'agents it was revoked from may take it again'
  end
  local usage = retry_usage(ARGV[6])
  if usage ~= '' then parts[#parts + 1] = usage end
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
  if h and redis.call('HDEL', C.lease .. n, 'paused') == 1 then
    -- Its wall-clock budget counts from the retry on.
    redis.call('HSET', C.lease .. n, 'budget_since_ms', arg(now))
    parts[#parts + 1] = 'task of ' .. h[1] .. ' resumed'
  elseif not h and requeue(n) then
    parts[#parts + 1] = 'back in the pool'
  elseif not h and labelled then
    -- The sync dropped its task while the label said a person must act: the next sync after
    -- the label's removal brings it back.
    parts[#parts + 1] = 'back in the pool at the next sync after the label is removed'
  end
  if #parts == 1 and parts[1] == '' then return done('nothing to retry on #' .. n, h and h[1]) end
  if parts[1] == '' then table.remove(parts, 1) end
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

elseif action == 'recovered' then
  local agent = ARGV[6]
  local waited = redis.call('HDEL', C.recovering, n) == 1
  if not waited and (ARGV[8] ~= 'linked' or redis.call('EXISTS', C.lock .. n) == 1
      or redis.call('HEXISTS', C.K.tasks, 'development:' .. n) == 0) then
    return done('nothing to recover on #' .. n, agent)
  end
  if waited then end_wait(C, n) end
  local held = {C.in_progress}
  if agent ~= '' then held[2] = agent end
  if ARGV[7] == '1' then
    want_labels(C.K.intent, C.K.outbox, n, {C.needs_review}, held, now)
    redis.call('SADD', C.K.reviewing, n)
    unready(C.K.tasks, C.K.ready, C.ready_role, 'development:' .. n)
    record_completion(C, n, agent, 'development:' .. n, 'development', now)
    timeline(C, 'completed', n, agent, 'development: recovered from GitHub after Redis lost it')
    ended = 'completed'
    return done('completed' .. (agent ~= '' and (' by ' .. agent) or '') .. ' (' .. reason
      .. '); in review', agent)
  end
  want_labels(C.K.intent, C.K.outbox, n, {}, held, now)
  requeue(n)
  return done('no PR for it on GitHub: back in the pool', agent)

elseif action == 'pause_agent' or action == 'stop_agent' then
  local agent, scope = target, ARGV[6]
  local kind = 'pause'
  if action == 'stop_agent' then kind = 'stop' end
  local cur = agent_pause(C, agent)
  if cur then
    cur = cjson.decode(cur)
    if (tonumber(cur.rank) or 4) > rank then return {lift_refusal(cur, rank, scope), agent, ''} end
  end
  local verb = kind == 'stop' and 'stopped' or 'paused'
  redis.call('HSET', C.paused_agents, agent, cjson.encode({kind = kind, by = actor, rank = rank,
    scope = scope, what = verb, reason = reason, at_ms = now}))
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
  local agent, scope = target, ARGV[6]
  local cur = agent_pause(C, agent)
  if not cur then return {'not paused here', agent, ''} end
  local refused = lift_refusal(cjson.decode(cur), rank, scope)
  if refused then return {refused, agent, ''} end
  redis.call('HDEL', C.paused_agents, agent)
  redis.call('HDEL', C.agent_streaks, agent)
  redis.call('HDEL', C.streak_first, agent)
  redis.call('HDEL', C.instant_failures, agent)
  return {'resumed', agent, ''}

elseif action == 'pause_repo' then
  n = ''
  local cur = redis.call('HGET', C.control, ARGV[6])
  if cur and (tonumber(cjson.decode(cur).rank) or 4) > rank then
    return done(lift_refusal(cjson.decode(cur), rank, 'repo'), nil)
  end
  redis.call('HSET', C.control, ARGV[6], cjson.encode({scope = ARGV[6], by = actor, rank = rank,
    what = 'paused', reason = reason, at_ms = now}))
  if ARGV[6] == 'broker' then return {'paused', '', ''} end
  return done('paused: nothing new is handed out here; leases keep running', nil)

elseif action == 'resume_repo' then
  n = ''
  local cur = redis.call('HGET', C.control, ARGV[6])
  if cur then
    local refused = lift_refusal(cjson.decode(cur), rank, 'repo')
    if refused then return done(refused, nil) end
  end
  redis.call('HDEL', C.control, ARGV[6])
  if redis.call('ZCARD', C.K.ready) > 0 then redis.call('PUBLISH', C.events, 'ready') end
  if ARGV[6] == 'broker' then return {'resumed', '', ''} end
  return done('resumed', nil)
end
return redis.error_reply('ERR unknown control action ' .. action)
