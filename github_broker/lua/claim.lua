-- claim.lua: settle the agent's previous task, pick the next task, lease it. One call.
-- KEYS, ARGV[1]: see _lib.lua.
-- ARGV[2] agent id, ARGV[3] new lease token, ARGV[4] outcome for a task the agent still
-- holds (completed | failed | abandoned), ARGV[5] mode (strict | best_effort),
-- ARGV[6] base branch, ARGV[7] how many ready tasks to look at per index and page (at
-- most SCAN_PAGES pages),
-- ARGV[8] '1' to only settle the previous task (multi-repository requests do this first),
-- ARGV[9] an issue number not to hand this agent ('' none: the one it just gave up),
-- ARGV[10] the request id ('' none), ARGV[11..] roles the agent accepts (none: any role).
-- A request id seen before (handout:{agent}:{rid}) gets the same task and lease again
-- while that lease lives, and settles nothing. A held task younger than settle_grace_ms is
-- not settled as completed either (a concurrent or retried request: the agent cannot have
-- done it): the request gets that task and lease back.
-- A review is not offered to the agent that did the development work until it has
-- waited author_fallback_ms for anyone else; a task in the agent's cool-down
-- (cooldown:{n}:{agent}) is not offered to it at all.
-- Returns {1, task_id, n, token, expires_ms, issue_json, role, branch, settled_n, outcome,
--          payload (review/fix details as JSON, or '')}
--      or {0, reason, settled_n, outcome, bucket} with reason 'empty' | 'bucket' | 'settled'
--      | 'replayed' (the request id's lease has ended meanwhile) (bucket -1: no open work
--      issue).
-- Error REBUILDING while the mirror is not rebuilt (Redis lost its data): the agent's held
-- task is unknown until the sync re-adopts it, and settling nothing would drop its outcome.
local C = context()
if mirror_missing(C) then return redis.error_reply(REBUILDING) end
local agent, token, prev_outcome, mode, base_branch = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local scan = tonumber(ARGV[7])
local rid = ARGV[10]
local now = now_ms()
reap(C, now, 10)

local handout_key = nil
if rid ~= '' then handout_key = C.handout .. agent .. ':' .. rid end

-- The answer for a lease already granted, remembered for this request id.
-- `raw`: the task's value when the caller has just read it.
local function granted(n, task_id, tok, expires, settled_n, raw)
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
  local issue = redis.call('GET', C.issue .. n) or ''
  return {1, task_id, tonumber(n), tok, expires, issue, role, branch, settled_n, prev_outcome, payload}
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
    if prev_n and live_lease(prev_n) then return {0, 'replayed', '', prev_outcome, -1} end
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
    -- retried request gave it up): the task goes back, but no failure budget is spent.
    end_lease(C, prev_n, prev_outcome, now, young, l, 'kept')
    stale_current = true
    settled_n = prev_n
    -- Don't hand straight back the task the agent just gave up.
    if prev_outcome ~= 'completed' then skip_id = l[3] end
  else
    stale_current = true
  end
end

local bucket = nil
local top = redis.call('ZRANGE', C.K.work, 0, 0, 'WITHSCORES')
if top[2] then bucket = tonumber(top[2]) end

if ARGV[8] == '1' then
  forget_current()
  return {0, 'settled', settled_n, prev_outcome, bucket or -1}
end

local skip_n = ARGV[9]
local sources = {}
if #ARGV >= 11 then
  for i = 11, #ARGV do sources[#sources + 1] = C.ready_role .. ARGV[i] end
else
  sources[1] = C.K.ready
end

-- The first usable task of one index, with its score and (when read) its value: the head
-- alone first (nearly always usable), then pages of `scan` entries, SCAN_PAGES in all, so
-- tasks in the agent's cool-down cannot hide the rest of the queue from it for long.
local SCAN_PAGES = 5
local function first_usable(src)
  local start, size = 0, 1
  for _ = 1, SCAN_PAGES do
    local items = redis.call('ZRANGE', src, start, start + size - 1, 'WITHSCORES')
    if #items == 0 then return nil end
    start, size = start + size, scan
    for i = 1, #items, 2 do
      local id, score, raw = items[i], tonumber(items[i + 1]), nil
      local n = string.match(id, ':(%d+)$')
      -- No cool-down key can exist while cool-downs are off.
      local usable = id ~= skip_id and n ~= skip_n
        and (C.cooldown_s <= 0 or redis.call('EXISTS', C.cooldown .. n .. ':' .. agent) == 0)
      if usable and redis.call('EXISTS', C.lock .. n) == 1 then
        -- Held but still indexed (a lease re-adopted by the reconciler): drop it here.
        unready(C.K.tasks, C.K.ready, C.ready_role, id)
        usable = false
      end
      if usable and string.sub(id, 1, 7) == 'review:' then
        raw = redis.call('HGET', C.K.tasks, id)
        if raw then
          local _, _, _, author, since = task_fields(raw)
          if author == agent and since + C.author_fallback_ms > now then usable = false end
        end
      end
      if usable then return id, score, raw end
    end
  end
  return nil
end

-- The best usable task over the sources, with its value. An index entry whose task value is
-- gone (the tasks hash lost alone: evicted) is dropped from the indexes, not an error, and
-- the pick is made again: up to SCAN_PAGES times, then the claim finds nothing this time.
local best_id, best_score, best_raw = nil, nil, nil
for _ = 1, SCAN_PAGES do
  local best_src = nil
  best_id, best_score, best_raw = nil, nil, nil
  for _, src in ipairs(sources) do
    local id, score, raw = first_usable(src)
    if id and (best_score == nil or score < best_score or (score == best_score and id < best_id)) then
      best_id, best_score, best_raw, best_src = id, score, raw, src
    end
  end
  if best_id == nil then break end
  best_raw = best_raw or redis.call('HGET', C.K.tasks, best_id)
  if best_raw then break end
  redis.call('ZREM', C.K.ready, best_id)
  redis.call('ZREM', best_src, best_id)
  best_id = nil
end

if best_id == nil then
  forget_current()
  return {0, 'empty', settled_n, prev_outcome, bucket or -1}
end
local priority = math.floor(best_score / C.priority_unit)
if mode == 'strict' and bucket ~= nil and priority > bucket then
  forget_current()
  return {0, 'bucket', settled_n, prev_outcome, bucket}
end

local n = string.match(best_id, ':(%d+)$')
local task_type = string.match(best_id, '^(%a+):')
local raw = best_raw
local _, _, _, _, _, branch = task_fields(raw)
local expires = start_lease(C, n, agent, token, task_type, now, now)
redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s_arg)
redis.call('SET', C.cand .. n .. ':' .. agent, cjson.encode({
  issue = tonumber(n), agent_id = agent, task_type = task_type, status = 'assigned',
  claimed_ms = now, token = token}), 'EX', C.cand_s_arg)
unready(C.K.tasks, C.K.ready, C.ready_role, best_id, raw)
want_labels(C.K.intent, C.K.outbox, n, {C.in_progress, agent}, {}, now)
timeline(C, 'claim', n, agent, best_id)
if task_type == 'development' and branch ~= '' then
  local job = 'branch:' .. n
  redis.call('HSET', C.K.outbox_data, job, cjson.encode({branch = branch, base = base_branch}))
  redis.call('ZADD', C.K.outbox, arg(now), job)
end
return granted(n, best_id, token, expires, settled_n, raw)
