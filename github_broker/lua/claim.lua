-- claim.lua: settle the agent's previous task, pick the next task, lease it. One call.
-- KEYS, ARGV[1]: see _lib.lua.
-- ARGV[2] agent id, ARGV[3] new lease token, ARGV[4] outcome for a task the agent still
-- holds (completed | failed | abandoned), ARGV[5] mode (strict | best_effort),
-- ARGV[6] base branch, ARGV[7] how many ready tasks to look at per page (see scan_limit),
-- ARGV[8] '1' to only settle the previous task (multi-repository requests do this first),
-- ARGV[9] an issue number not to hand this agent ('' none: the one it just gave up),
-- ARGV[10] the request id ('' none), ARGV[11] the fence ('' none): Redis time (ms) after
-- which the script refuses to run (OUTLIVED), the end of the agent's mutex that a request
-- across repositories holds (store/agents.py): a process paused past it must not settle or
-- claim once another request of the agent may hold the mutex; ARGV[12..] roles the agent
-- accepts (none: any role).
-- A request id seen before (handout:{agent}:{rid}) gets the same task and lease again
-- while that lease lives, and settles nothing. A held task younger than settle_grace_ms is
-- not settled as completed either (a concurrent or retried request: the agent cannot have
-- done it): the request gets that task and lease back.
-- After settling: a paused agent (the circuit breaker or a maintainer) gets nothing; a task a
-- maintainer reassigned to the agent (reserved:{agent}) comes first, whatever the bucket or
-- a repository pause; a paused repository hands out nothing else. Then the rules of
-- task_verdict pick the task (see pick_task) and the strict bucket may hold it back.
-- Returns {1, task_id, n, token, expires_ms, issue_json, role, branch, settled_n, outcome,
--          payload (review/fix details as JSON, or ''), continues (the reassignment as
--          JSON, or ''), claimed_ms}
--      or {0, reason, settled_n, outcome, bucket, detail} with reason 'empty' | 'bucket' |
--      'settled' | 'replayed' (the request id's lease has ended meanwhile) | 'agent_paused'
--      | 'repo_paused' (detail: the pause as JSON) | 'quarantine' (detail: until when, ms,
--      leases are proven after Redis lost them: see quarantine_until) (bucket -1: no work
--      issue holds it);
--      with ARGV[8] '1', detail is '1' when a reassigned task waits for the agent here.
-- Error REBUILDING while the mirror is not rebuilt (Redis lost its data): the agent's held
-- task is unknown until the sync re-adopts it, and settling nothing would drop its outcome.
local C = context()
if mirror_missing(C) then return redis.error_reply(REBUILDING) end
local agent, token, prev_outcome, mode, base_branch = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local scan = tonumber(ARGV[7])
local rid = ARGV[10]
local now = now_ms()
local fence = tonumber(ARGV[11])
if fence and now > fence then return redis.error_reply(OUTLIVED) end
reap(C, now, 10)

local handout_key = nil
if rid ~= '' then handout_key = C.handout .. agent .. ':' .. rid end

-- The answer for a lease already granted, remembered for this request id.
-- `raw`: the task's value when the caller has just read it; `continues`: the reassignment.
local function granted(n, task_id, tok, expires, settled_n, raw, continues, claimed)
  if handout_key then
    redis.call('SET', handout_key, cjson.encode({n = tonumber(n), task_id = task_id, token = tok}),
      'PX', C.lease_ms_arg)
  end
  raw = raw or redis.call('HGET', C.K.tasks, task_id)
  local role, pr, branch = '', '', ''
  if raw then
    local _
    _, role, pr, _, _, branch = task_fields(raw)
  end
  local task_type = string.match(task_id, '^(%a+):')
  local payload = ''
  if task_type == 'review' then
    payload = redis.call('HGET', C.review_state .. n, 'payload') or ''
  elseif task_type == 'fix' and pr ~= '' then
    payload = redis.call('GET', C.fix .. pr) or ''
  end
  continues = continues or redis.call('HGET', C.lease .. n, 'continues') or ''
  local issue = redis.call('GET', C.issue .. n) or ''
  claimed = claimed or tonumber(redis.call('HGET', C.lease .. n, 'claimed_ms')) or now
  return {1, task_id, tonumber(n), tok, expires, issue, role, branch, settled_n, prev_outcome,
          payload, continues, claimed}
end

-- The live lease of issue n if `agent` holds it: its lease_fields
-- {agent, token, task_id, task_type, claimed_ms, expires_ms}.
local function live_lease(n)
  local h = lease_fields(C, n)
  if h[1] ~= agent or redis.call('EXISTS', C.lock .. n) == 0 then return nil end
  return h
end

local prev_n = redis.call('GET', C.agent .. agent)
if handout_key then
  local raw = redis.call('GET', handout_key)
  if raw then
    local h = cjson.decode(raw)
    local l = live_lease(tostring(h.n))
    if l and l[2] == h.token then return granted(tostring(h.n), l[3], l[2], tonumber(l[6]), '') end
    -- That lease ended since: a repeat settles nothing, so it only claims when nothing is held.
    if prev_n and live_lease(prev_n) then return {0, 'replayed', '', prev_outcome, -1, ''} end
  end
end

-- `stale_current`: the agent's current-task key names a task it no longer holds; the
-- claim below rewrites it, any other way out deletes it (forget_current).
local settled_n, skip_id, stale_current = '', nil, false
local function forget_current()
  if stale_current then redis.call('DEL', C.agent .. agent) end
end
if prev_n then
  local l = live_lease(prev_n)
  if l then
    local claimed = tonumber(l[5])
    local young = claimed ~= nil and now - claimed < C.settle_grace_ms
    if prev_outcome == 'completed' and l[2] ~= ADOPTED and young then
      return granted(prev_n, l[3], l[2], tonumber(l[6]), '')
    end
    -- A failure reported inside the grace cannot be the agent's work on it (a concurrent or
    -- retried request gave it up): the task goes back, and the budget is spent only once the
    -- agent keeps doing it (instant_failure_counts).
    end_lease(C, prev_n, prev_outcome, now, young and 'instant' or false, l, 'kept')
    stale_current = true
    settled_n = prev_n
    -- Don't hand straight back the task the agent just gave up.
    if prev_outcome ~= 'completed' then skip_id = l[3] end
  else
    stale_current = true
  end
end

-- From here on the pool may have changed (settling, the lazy reap): every answer republishes
-- the repository's line of the index first.
local function out(reply)
  publish_index(C)
  return reply
end

local bucket = bucket_of(C)

if ARGV[8] == '1' then
  forget_current()
  local waits = ''
  if redis.call('EXISTS', C.reserved .. agent) == 1 then waits = '1' end
  return out({0, 'settled', settled_n, prev_outcome, bucket or -1, waits})
end

local paused = agent_pause(C, agent)
if paused then
  forget_current()
  return out({0, 'agent_paused', settled_n, prev_outcome, bucket or -1, paused})
end

-- A task a maintainer reassigned to this agent: it continues that work first.
local reserved = reservation(C, agent, false)
local best_id, best_score, raw, continues = nil, nil, nil, nil
if reserved then
  best_id = reserved.task_id
  raw = redis.call('HGET', C.K.tasks, best_id)
  continues = cjson.encode(reserved)
  redis.call('DEL', C.reserved .. agent)
  redis.call('ZREM', C.reservations, tostring(reserved.n))
  redis.call('HDEL', C.reserved_issues, tostring(reserved.n))
else
  local held_back = repo_pause(C)
  if held_back then
    forget_current()
    return out({0, 'repo_paused', settled_n, prev_outcome, bucket or -1, held_back})
  end
  local proving = quarantine_until(C, now)
  if proving then
    forget_current()
    return out({0, 'quarantine', settled_n, prev_outcome, bucket or -1, arg(proving)})
  end
  best_id, best_score, raw = pick_task(C, sources_of(C, 12), agent, skip_id, ARGV[9], now,
    scan, false)
  if best_id == nil then
    forget_current()
    return out({0, 'empty', settled_n, prev_outcome, bucket or -1, ''})
  end
  local priority = math.floor(best_score / C.priority_unit)
  if mode == 'strict' and bucket ~= nil and priority > bucket then
    forget_current()
    return out({0, 'bucket', settled_n, prev_outcome, bucket, ''})
  end
end

local n = string.match(best_id, ':(%d+)$')
local task_type = string.match(best_id, '^(%a+):')
local _, _, _, _, _, branch = task_fields(raw)
local expires = start_lease(C, n, agent, token, task_type, now, now)
if continues then redis.call('HSET', C.lease .. n, 'continues', continues) end
redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s_arg)
redis.call('SET', C.cand .. n .. ':' .. agent, cjson.encode({
  issue = tonumber(n), agent_id = agent, task_type = task_type, status = 'assigned',
  claimed_ms = now, token = token}), 'EX', C.cand_s_arg)
unready(C.K.tasks, C.K.ready, C.ready_role, best_id, raw)
want_labels(C.K.intent, C.K.outbox, n, {C.in_progress, agent}, {}, now)
timeline(C, 'claim', n, agent, best_id, {raw = raw})
-- A reassigned task keeps its branch: the agent continues the work already pushed there.
if task_type == 'development' and branch ~= '' and not continues then
  local job = 'branch:' .. n
  redis.call('HSET', C.K.outbox_data, job, cjson.encode({branch = branch, base = base_branch}))
  redis.call('ZADD', C.K.outbox, arg(now), job)
end
return out(granted(n, best_id, token, expires, settled_n, raw, continues or '', now))
