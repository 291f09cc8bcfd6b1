-- _lib.lua: helpers prepended to every script at load time (not a script of its own).
-- Written in the Lua 5.1 subset that Redis and fakeredis (lupa) run alike.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A whole number as a command argument. Redis formats a number argument with "%.17g"
-- (about 0.8 µs each); the context's integers come as text already (`<name>_arg`).
local function arg(x)
  return string.format('%d', x)
end

local function set_of(list)
  local s = {}
  if type(list) == 'table' then
    for _, v in ipairs(list) do s[v] = true end
  end
  return s
end

local function sorted_keys(s)
  local out = {}
  for k, _ in pairs(s) do out[#out + 1] = k end
  table.sort(out)
  return out
end

local function is_empty(s) return next(s) == nil end

-- An issue's label intent {add, remove, on, v} as sets (cjson writes an empty list as {}).
local function intent_sets(raw)
  local cur = {}
  if raw then cur = cjson.decode(raw) end
  return set_of(cur.add), set_of(cur.remove), set_of(cur.on), tonumber(cur.v) or 0
end

local function intent_json(adds, removes, on, v)
  return cjson.encode({add = sorted_keys(adds), remove = sorted_keys(removes),
                       on = sorted_keys(on), v = v})
end

-- Label lists of an intent are kept sorted and hold a few labels each: linear scans on the
-- decoded lists cost less than building sets and sorting them again on every change.
local function list_find(list, x)
  for i = 1, #list do
    if list[i] == x then return i end
  end
  return nil
end

local function list_add(list, x)
  if list_find(list, x) then return end
  local i = #list
  while i > 0 and list[i] > x do
    list[i + 1] = list[i]
    i = i - 1
  end
  list[i + 1] = x
end

local function list_drop(list, x)
  local i = list_find(list, x)
  if i then table.remove(list, i) end
end

-- An intent's label list as decoded (cjson reads {} for an empty list); the writers keep
-- it sorted, and a list that is not gets sorted here.
local function label_list(v)
  if type(v) ~= 'table' then return {} end
  for i = 2, #v do
    if v[i - 1] > v[i] then
      table.sort(v)
      break
    end
  end
  return v
end

-- Merge a label delta into the issue's intent and queue a GitHub write for it.
-- The intent holds only what is still to do (add, remove) and the labels a write may have
-- put on GitHub since (on: taken by a drain, not removed since); a drain prunes what it
-- applied (outbox_done), so the record stays a few labels long however many agents held
-- the issue. A later delta wins over an earlier one for the same label. Removing a label
-- that is only wished (never sent) cancels the wish: no call for a label never applied,
-- and an intent left with nothing to do and nothing sent leaves with its job.
-- The job keeps its first due time (NX): the queue's lag is the age of its oldest wish.
local function want_labels(intent_key, outbox_key, n, add, remove, due_ms)
  local raw = redis.call('HGET', intent_key, n)
  local adds, removes, on, v = {}, {}, {}, 0
  if raw then
    local cur = cjson.decode(raw)
    adds, removes, on = label_list(cur.add), label_list(cur.remove), label_list(cur.on)
    v = tonumber(cur.v) or 0
  end
  for _, l in ipairs(add) do
    if list_find(removes, l) then  -- its removal may not have reached GitHub
      list_add(on, l)
      list_drop(removes, l)
    end
    list_add(adds, l)
  end
  for _, l in ipairs(remove) do
    if list_find(on, l) or not list_find(adds, l) then list_add(removes, l) end
    list_drop(adds, l)
  end
  if #adds == 0 and #removes == 0 and #on == 0 then
    redis.call('HDEL', intent_key, n)
    redis.call('ZREM', outbox_key, 'labels:' .. n)
    return
  end
  redis.call('HSET', intent_key, n,
    cjson.encode({add = adds, remove = removes, on = on, v = v + 1}))
  if #adds == 0 and #removes == 0 then
    redis.call('ZREM', outbox_key, 'labels:' .. n)
  else
    redis.call('ZADD', outbox_key, 'NX', arg(due_ms), 'labels:' .. n)
  end
end

-- The tasks hash holds "score|role|pr|author|since_ms|branch" per task id; the branch goes
-- last because git allows '|' in branch names.
local function task_fields(raw)
  local score, role, pr, author, since, branch =
    string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return tonumber(score), role, pr, author, tonumber(since), branch
end

local function task_value(score, role, pr, author, since, branch)
  return table.concat({score, role, pr, author, since, branch}, '|')
end

-- `raw`: the task's value when the caller has just read it.
local function make_ready(tasks_key, ready_key, ready_role_prefix, task_id, raw)
  raw = raw or redis.call('HGET', tasks_key, task_id)
  if not raw then return false end
  local score, role = task_fields(raw)
  redis.call('ZADD', ready_key, score, task_id)
  redis.call('ZADD', ready_role_prefix .. role, score, task_id)
  return true
end

-- `raw`: the task's value when the caller has just read it.
local function unready(tasks_key, ready_key, ready_role_prefix, task_id, raw)
  raw = raw or redis.call('HGET', tasks_key, task_id)
  redis.call('ZREM', ready_key, task_id)
  if raw then
    local _, role = task_fields(raw)
    redis.call('ZREM', ready_role_prefix .. role, task_id)
  end
end

-- Dependencies (docs/dependencies.md) ------------------------------------------------------
-- The state of blocker `ref` ('owner/name#n') as this repository knows it at this moment. A
-- blocker of this repository is open while the mirror holds it open: the sync and the webhook
-- worker move `open` for the blocker itself, in the same script, so a blocker reopened after
-- the dependent's last sync blocks at once. Otherwise graph:state holds what the leader last
-- learnt ('completed', 'not_planned', 'duplicate', 'open', 'unserved', written for a blocker
-- of another served repository whenever its own sync or webhook moves it); nothing known is
-- 'unknown'.
local function blocker_state(C, ref)
  local repo, m = string.match(ref, '^(.+)#(%d+)$')
  if repo and string.lower(repo) == C.repository_lower
      and redis.call('SISMEMBER', C.K.open, m) == 1 then
    return 'open'
  end
  return redis.call('HGET', C.dep_state, ref) or 'unknown'
end

-- The first blocker (and its state) that keeps issue n from being handed out, or nil. Only a
-- blocker closed as completed lets it go (or closed as not planned, when dep_done says so):
-- an open, unreadable, unserved or unknown one blocks (fail closed). Bounded: GitHub links 50
-- blockers to an issue at most.
local function blocker_of(C, n)
  if not C.graph then return nil end
  local raw = redis.call('HGET', C.deps, n)
  if not raw then return nil end
  for _, ref in ipairs(cjson.decode(raw)) do
    local state = blocker_state(C, ref)
    local done = false
    for _, s in ipairs(C.dep_done) do
      if s == state then done = true end
    end
    if not done then return ref, state end
  end
  return nil
end
-- -------------------------------------------------------------------------------------------

-- Every repository script gets the same KEYS and ARGV[1]:
-- KEYS: 1 tasks, 2 ready, 3 work, 4 leases, 5 intent, 6 outbox, 7 outbox:data,
--       8 skipped, 9 open (all of one repository, so one Cluster slot)
--       10 reviewing
-- ARGV[1]: the repository's full name (owner/name). One compiled script set serves every
--   repository: store/scripts.py prepends `base_context()`, the deployment's constants: label
--   names (in_progress, needs_review, needs_human), times (lease_ms, agent_s, cand_s, tomb_s,
--   author_fallback_ms, settle_grace_ms, cooldown_s, keep_away_ms), bounds (timeline_max,
--   audit_max, max_failures, breaker_streak, instant_failures_allowed, budget_tokens,
--   budget_cost), priority_unit (a task score divided by it, rounded down, is the task's
--   priority), cools (any cool-down may exist), people_hold, the events channel; and
--   `key_suffixes()`: each of the repository's other key names (per-issue prefixes such as issue,
--   lock, lease, agent, cand, tomb; hashes and streams such as timeline, control, audit; see
--   keys.py for every key) as a suffix of its key base, which is KEYS[1] less its last
--   tasks_suffix_len bytes. `context` completes a key name the first time a script reads it.
local function context()
  local C = base_context()
  local tasks = KEYS[1]
  local base = string.sub(tasks, 1, #tasks - C.tasks_suffix_len)
  local suffixes
  C.repository = ARGV[1]
  C.K = {tasks = tasks, ready = KEYS[2], work = KEYS[3], leases = KEYS[4], intent = KEYS[5],
         outbox = KEYS[6], outbox_data = KEYS[7], skipped = KEYS[8], open = KEYS[9],
         reviewing = KEYS[10]}
  return setmetatable(C, {__index = function(t, name)
    local value
    if name == 'repository_lower' then
      value = string.lower(t.repository)
    else
      suffixes = suffixes or key_suffixes()
      local suffix = suffixes[name]
      if suffix == nil then return nil end
      value = base .. suffix
    end
    rawset(t, name, value)
    return value
  end})
end

-- Fencing: the scripts a poller leader runs (sync results, write jobs, reaping) pass its
-- leader epoch. A higher epoch raises the repository's fence; a lower one means the caller
-- lost leadership (it stalled and another process took over) and nothing it sends may land.
-- Epoch '' or '0' is a caller outside the leader election (the one-off CLI sync): unfenced.
-- Returns nil to go on, or the error reply the script must return at once.
local function fence(C, epoch_arg)
  local epoch = tonumber(epoch_arg) or 0
  if epoch <= 0 then return nil end
  local cur = tonumber(redis.call('GET', C.fence)) or 0
  if epoch < cur then
    return redis.error_reply('FENCED epoch ' .. epoch_arg .. ' is older than ' .. cur)
  end
  if epoch > cur then
    redis.call('SET', C.fence, epoch_arg)
    -- Writes a deposed leader took are in flight nowhere now that we lead: due at once.
    local taken = redis.call('HGETALL', C.outbox_taken)
    for i = 1, #taken, 2 do
      if tonumber(taken[i + 1]) < epoch then
        redis.call('ZADD', C.K.outbox, 'XX', 0, taken[i])
        redis.call('HDEL', C.outbox_taken, taken[i])
      end
    end
  end
  return nil
end

-- Redis lost its data (or the first sync has not finished): until a complete sync pass has
-- rebuilt the mirror, a lease the store does not know may well be live on GitHub.
local function mirror_missing(C)
  return redis.call('EXISTS', C.mirror) == 0
end

local REBUILDING = 'REBUILDING the mirror is being rebuilt from GitHub; retry shortly'
local OUTLIVED = "OUTLIVED this request outlived the agent's mutex (the broker process "
  .. 'stalled); retry'

-- What a task_candidate record says after each way a lease can end.
local CANDIDATE_STATUS = {
  completed = 'completed', failed = 'failed', abandoned = 'abandoned', expired = 'expired',
  revoked = 'revoked', issue_closed = 'revoked', label_removed = 'revoked',
}
-- Outcomes after which the task goes straight back to the pool.
local REQUEUE = {failed = true, abandoned = true, expired = true}

-- Outcomes that spend the failure budget (see count_failure).
local FAILURE = {failed = true, abandoned = true, expired = true}

-- Adopted leases (rebuilt from GitHub labels after Redis lost them) carry this token until
-- their agent's first heartbeat binds its own.
local ADOPTED = 'adopted'

-- Drop a task from the pool. A task is in ready:{role} exactly when it is in ready (both
-- are always written together), so one not in ready needs no read of its role.
local function drop_task(C, task_id)
  if redis.call('ZREM', C.K.ready, task_id) == 1 then
    local raw = redis.call('HGET', C.K.tasks, task_id)
    if raw then
      local _, role = task_fields(raw)
      redis.call('ZREM', C.ready_role .. role, task_id)
    end
  end
  redis.call('HDEL', C.K.tasks, task_id)
end

-- Append an action to the repository's audit log: who (a maintainer's name, `broker` for
-- the broker's own decisions), what, on which issue and agent, why, and what really happened.
-- `rank` (models.Authority; the broker's when nil) is written as the entry's `authority`;
-- `state`, when the action ended a lease, the state it left the task in (models.TaskState:
-- completed, failed, timed_out, cancelled).
local function audit(C, actor, action, n, agent, reason, outcome, rank, state)
  redis.call('XADD', C.audit, 'MAXLEN', '~', C.audit_max_arg, '*', 'actor', actor,
    'action', action, 'n', tostring(n or ''), 'agent', agent or '', 'reason', reason or '',
    'outcome', outcome or '', 'authority', tostring(rank or 2), 'state', state or '')
end

-- Decisions and who may lift them (steering/authority.py; docs/architecture.md "Who may steer
-- what"). An actor travels as '<rank>:<name>', its rank a models.Authority: 0 the agent,
-- 1 a writer commenting, 2 the broker, 3 a maintainer, 4 an administrator.
local RANK_TITLE = {[0] = 'the agent', [1] = 'a writer of the repository', [2] = 'the broker',
  [3] = 'a maintainer', [4] = 'an administrator'}
local BROKER_RANK = 2
-- A waiting entry's decision, in words (lift_refusal says it).
local WAIT_WHAT = {held = 'held', budget = 'set aside at its budget', needs_human =
  'given up (needs-human)', no_pr = 'left waiting for a PR', awaiting_feedback = 'reviewed'}

-- (rank, name) of an actor argument; a bare name is the broker's own.
local function parse_actor(text)
  local rank, name = string.match(text, '^(%d):(.*)$')
  if not rank then return BROKER_RANK, text end
  return tonumber(rank), name
end

-- Why `rank`, acting for `scope` ('deployment': every repository; 'repo': this one), may not
-- lift the decision `rec` ({what, by, rank, scope}), or nil when it may. A decision recorded
-- before ranks were kept counts as an administrator's (fail closed).
local function lift_refusal(rec, rank, scope)
  local need = tonumber(rec.rank) or 4
  local what = (rec.what or 'decided') .. ' by ' .. tostring(rec.by or '?') .. ' ('
    .. RANK_TITLE[need] .. ')'
  if rank < need then
    return 'refused: ' .. what .. '; only ' .. RANK_TITLE[need] .. ' or higher may lift it'
  end
  if rec.scope == 'deployment' and scope ~= 'deployment' then
    return 'refused: ' .. what .. ' for the whole deployment; only someone who may act on '
      .. 'every repository (an administrator) may lift it'
  end
  return nil
end

-- Issue n waits on a person (code: awaiting_feedback | needs_human | budget | held): it leaves
-- the strict bucket (agents never idle because a person is slow) unless people_hold says
-- such issues hold it too. The entry keeps the issue's priority to restore it, and its age
-- while the code stays the same.
-- `by`, `rank`: who decided it (the broker's own when nil); only the same or a higher rank
-- lifts it (lift_refusal: a retry).
local function wait_for_person(C, n, code, detail, now, by, rank)
  local prio = tonumber(redis.call('ZSCORE', C.K.work, n))
  local since = now
  local raw = redis.call('HGET', C.waiting, n)
  if raw then
    local cur = cjson.decode(raw)
    if cur.code == code then since = cur.since_ms end
    if prio == nil then prio = tonumber(cur.prio) end
  end
  redis.call('HSET', C.waiting, n, cjson.encode({code = code, since_ms = since, detail = detail,
    prio = prio or -1, by = by or 'broker', rank = rank or BROKER_RANK,
    what = WAIT_WHAT[code] or code}))
  if not C.people_hold then redis.call('ZREM', C.K.work, n) end
end

-- Issue n has agent work again (a fix round, a review, a retry): it holds the bucket at its
-- priority again. Returns the code it waited for, or nil.
local function end_wait(C, n)
  local raw = redis.call('HGET', C.waiting, n)
  if not raw then return nil end
  redis.call('HDEL', C.waiting, n)
  local cur = cjson.decode(raw)
  local prio = tonumber(cur.prio) or -1
  -- An issue with an open blocker holds no bucket (blocker_of).
  if prio >= 0 and redis.call('SISMEMBER', C.K.open, n) == 1 and not blocker_of(C, n) then
    redis.call('ZADD', C.K.work, arg(prio), n)
  end
  return cur.code
end

-- The waiting entry's code of issue n, or nil.
local function waiting_code(C, n)
  local raw = redis.call('HGET', C.waiting, n)
  return raw and cjson.decode(raw).code or nil
end

-- Waiting codes under which no task of the issue is handed out: a maintainer held it, a
-- budget was reached (until a maintainer retries it), or the broker reads GitHub to learn
-- whether a task Redis lost was completed (`recovering`, see to_recovering).
local PARKED = {held = true, budget = true, recovering = true}

-- The circuit breaker's or a maintainer's pause of `agent` in this repository, as JSON, or
-- nil. Every repository holds a copy (store/control.py writes them all).
local function agent_pause(C, agent)
  local raw = redis.call('HGET', C.paused_agents, agent)
  if raw then return raw end
  return nil
end

-- Until when (ms) this repository hands out nothing new after its mirror was rebuilt from a
-- loss: agents whose leases no label recorded get one heartbeat interval to prove them with
-- their signed tokens before anyone else can take their issues. Nil when not quarantined.
local function quarantine_until(C, now)
  local until_ms = tonumber(redis.call('GET', C.quarantine))
  if until_ms and until_ms > now then return until_ms end
  return nil
end

-- The maintenance pause of this repository (or of the whole broker), as JSON, or nil.
local function repo_pause(C)
  local h = redis.call('HMGET', C.control, 'repo', 'broker')
  return h[1] or h[2] or nil
end

-- What completing each task type means for the issue's review state.
local function record_completion(C, n, agent, task_id, task_type, now)
  local state_key = C.review_state .. n
  if task_type == 'development' then
    redis.call('HSET', state_key, 'dev_agent', agent)
  elseif task_type == 'review' then
    redis.call('HSET', state_key, 'reviewed', '1')
  elseif task_type == 'fix' then
    local raw = redis.call('HGET', C.K.tasks, task_id)
    if raw then
      local _, _, pr = task_fields(raw)
      local fix_raw = redis.call('GET', C.fix .. pr)
      if fix_raw then
        local fix = cjson.decode(fix_raw)
        local handled = set_of(cjson.decode(redis.call('HGET', state_key, 'handled') or '[]'))
        for _, id in ipairs(fix.comment_ids or {}) do handled[id] = true end
        local ids = {}
        for id, _ in pairs(handled) do ids[#ids + 1] = id end
        table.sort(ids)
        redis.call('HSET', state_key, 'handled', cjson.encode(ids))
        fix.status = 'completed'
        redis.call('SET', C.fix .. pr, cjson.encode(fix), 'KEEPTTL')
      end
    end
  end
  drop_task(C, task_id)
  -- Reviewed (or fixed) and no new feedback yet: the PR waits for a maintainer to merge it
  -- or to ask for changes (which makes a fix round and ends the wait).
  if task_type ~= 'development' and redis.call('HEXISTS', C.K.tasks, 'fix:' .. n) == 0 then
    wait_for_person(C, n, 'awaiting_feedback',
      'reviewed; waits for a maintainer to merge the PR or to ask for changes', now)
  end
end

-- History: every event on the timeline is counted in the minute of its stream entry's id, so
-- a chart's count is the timeline's count by construction (store/history.py reads them).
-- A count goes to the minute's hash only (`history:m:{minute}`, for history_minute_s), and
-- the minute is marked unfolded (`history:unfolded`): the leader folds finished minutes into
-- the hour's hash (`history:h:{hour}`, what a 24 h chart reads) and the running totals
-- (`history:total`, /metrics) once (history_fold.lua); readers add the unfolded minutes.
-- Fields: `ev:<kind>`; a hand-out's `claim:<type>`; a development hand-out's time since
-- its task became claimable (`wait:<le>` per bucket, `wait:ms`); a completed development
-- task's time from its claim (`pr:<le>`, `pr:ms`); per agent, lease ends `a:<agent>:ok` |
-- `a:<agent>:fail` and its completed tasks' time `a:<agent>:ms`. Bucket bounds (s) as the
-- Prometheus histograms'.
local HISTORY_LE_S = {1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400}
local AGENT_END = {completed = 'ok', failed = 'fail', abandoned = 'fail', expired = 'fail'}

local function history_le(ms)
  for _, le in ipairs(HISTORY_LE_S) do
    if ms <= le * 1000 then return tostring(le) end
  end
  return '+Inf'
end

-- A duration (ms) as histogram fields of `name`.
local function history_duration(out, name, ms)
  if ms < 0 then ms = 0 end
  out[#out + 1] = name .. ':' .. history_le(ms)
  out[#out + 1] = 1
  out[#out + 1] = name .. ':ms'
  out[#out + 1] = ms
end

-- The fields (name, increment, ...) an event counts at `at_ms`. `facts`, when the caller has
-- them at hand (nil: read here): a claim's task value {raw = ...}; a lease end's
-- task_candidate record as end_lease writes it {task_type, claimed_ms, ended_ms}.
local function history_fields(C, at_ms, kind, n, agent, detail, facts)
  local out = {'ev:' .. kind, 1}
  if kind == 'claim' then
    local task_type = string.match(detail or '', '^(%a+):')
    if not task_type then return out end
    out[#out + 1] = 'claim:' .. task_type
    out[#out + 1] = 1
    local raw = task_type == 'development'
      and (facts and facts.raw or redis.call('HGET', C.K.tasks, detail))
    if raw then
      local _, _, _, _, since = task_fields(raw)
      if since then history_duration(out, 'wait', at_ms - since) end
    end
  elseif AGENT_END[kind] and agent and agent ~= '' then
    local cand = facts
    if not cand then
      local raw = redis.call('GET', C.cand .. n .. ':' .. agent)
      cand = raw and cjson.decode(raw)
    end
    out[#out + 1] = 'a:' .. agent .. ':' .. AGENT_END[kind]
    out[#out + 1] = 1
    if kind == 'completed' and cand and tonumber(cand.claimed_ms) then
      local took = tonumber(cand.ended_ms or at_ms) - tonumber(cand.claimed_ms)
      out[#out + 1] = 'a:' .. agent .. ':ms'
      out[#out + 1] = math.max(0, took)
      if cand.task_type == 'development' then history_duration(out, 'pr', took) end
    end
  end
  return out
end

-- A minute's hash is only counted in during that minute, so its time to live is set, and
-- the minute marked unfolded, when the event's first field (`ev:<kind>`) is new in it (a
-- new hash always is) rather than on every event.
local function history_count(C, entry_id, kind, n, agent, detail, facts)
  local at_ms = tonumber(string.match(entry_id, '^(%d+)'))
  local minute = math.floor(at_ms / 60000)
  local key = C.history .. minute
  local fields = history_fields(C, at_ms, kind, n, agent, detail, facts)
  local new_minute = redis.call('HINCRBY', key, fields[1], arg(fields[2])) == fields[2]
  for i = 3, #fields, 2 do
    redis.call('HINCRBY', key, fields[i], arg(fields[i + 1]))
  end
  if new_minute then
    redis.call('EXPIRE', key, C.history_minute_s_arg)
    redis.call('ZADD', C.history_unfolded, arg(minute), arg(minute))
  end
end

-- Append an event to the repository's timeline stream (the dashboard's "recent events").
-- Capped approximately, so a busy repository costs a bounded stream. Counted in the history
-- (`facts`: see history_fields).
local function timeline(C, kind, n, agent, detail, facts)
  local id = redis.call('XADD', C.timeline, 'MAXLEN', '~', C.timeline_max_arg, '*', 'kind', kind,
             'n', tostring(n or ''), 'agent', agent or '', 'detail', detail or '')
  history_count(C, id, kind, n, agent, detail, facts)
end

-- `agent` is not handed issue n before `until_ms` (a failure's cool-down, or a person revoked
-- it from the agent); a later end already set stays, and the key lives as long as its latest.
local function cool_down(C, agent, n, until_ms, now)
  local key = C.cooldowns .. agent
  if (tonumber(redis.call('ZSCORE', key, n)) or 0) < until_ms then
    redis.call('ZADD', key, arg(until_ms), n)
  end
  if redis.call('PTTL', key) < until_ms - now then redis.call('PEXPIRE', key, arg(until_ms - now)) end
end


-- The agents whose failures issue n was charged with in this round (failure_charges).
local function charges_of(C, n)
  local raw = redis.call('HGET', C.failure_charges, n)
  return raw and cjson.decode(raw) or {}
end

-- The breaker convicted `agent`: the failure that started its streak (on issue n) was not the
-- issue's fault. The charge is taken back; if that charge helped give the issue up, the issue
-- is revived: needs-human lifted (its removal queued), no longer waiting, and queued in
-- `revived` for the leader to index its tasks again (reap.lua hands the list over).
local function take_back_charge(C, agent, n, now)
  local list = charges_of(C, n)
  local i = list_find(list, agent)
  if i then
    table.remove(list, i)
    if #list > 0 then
      redis.call('HSET', C.failure_charges, n, cjson.encode(list))
    else
      redis.call('HDEL', C.failure_charges, n)
    end
    if redis.call('HINCRBY', C.task_failures, n, -1) <= 0 then
      redis.call('HDEL', C.task_failures, n)
    end
    return
  end
  local raw = redis.call('HGET', C.K.skipped, n)
  local sk = raw and cjson.decode(raw)
  if not sk or sk.code ~= 'too_many_failures' or not list_find(sk.agents or {}, agent) then
    return
  end
  redis.call('HDEL', C.K.skipped, n)
  if waiting_code(C, n) == 'needs_human' then end_wait(C, n) end
  want_labels(C.K.intent, C.K.outbox, n, {}, {C.needs_human}, now)
  redis.call('RPUSH', C.revived, n)
  audit(C, 'broker', 'charge_taken_back', n, agent,
    'the circuit breaker convicted ' .. agent .. ', one of the agents that failed it',
    C.needs_human .. ' lifted; back in the pool')
  timeline(C, 'revived', n, agent, 'a broken agent\'s failure is not the issue\'s')
end

-- The circuit breaker: `agent` failed breaker_streak tasks in a row here. It is paused (a
-- maintainer resumes it); the trip is queued for the poller, which pauses it in every other
-- repository too (reap.lua returns the trips). The failure that started its streak, the only
-- one charged to an issue, is taken back.
local function trip_breaker(C, agent, n, streak, now)
  if redis.call('HEXISTS', C.paused_agents, agent) == 1 then return end
  local reason = streak .. ' failed tasks in a row (last #' .. n .. ')'
  redis.call('HSET', C.paused_agents, agent, cjson.encode({kind = 'breaker', by = 'broker',
    rank = BROKER_RANK, scope = 'deployment', what = 'paused by the circuit breaker',
    reason = reason, at_ms = now}))
  redis.call('RPUSH', C.trips, agent)
  audit(C, 'broker', 'circuit_breaker', n, agent, reason, 'agent paused')
  local first = redis.call('HGET', C.streak_first, agent)
  redis.call('HDEL', C.streak_first, agent)
  if first then take_back_charge(C, agent, first, now) end
end

-- Spend one unit of the failure budget for `agent`'s failure of issue n: a cool-down before
-- the agent sees n again and the agent's streak, always; the issue's count only for the
-- first failure of a streak. An agent that fails task after task is the common factor, not
-- the issues: its later failures are not charged, and when the breaker trips its one
-- charged failure is taken back (take_back_charge), also from an issue it helped give up.
-- Returns true when the issue's count reached max_failures: the issue then gets needs-human
-- (the caller queues the label), its tasks leave the pool and `skipped` says why and whose
-- failures; the count starts again for the next round.
local function count_failure(C, n, agent, outcome, now)
  if C.cooldown_s > 0 then cool_down(C, agent, n, now + C.cooldown_s * 1000, now) end
  local streak = redis.call('HINCRBY', C.agent_streaks, agent, 1)
  local charged = streak == 1
  if charged then
    redis.call('HSET', C.streak_first, agent, n)
    local list = charges_of(C, n)
    list[#list + 1] = agent
    redis.call('HSET', C.failure_charges, n, cjson.encode(list))
  end
  if C.breaker_streak > 0 and streak >= C.breaker_streak then
    trip_breaker(C, agent, n, streak, now)
    if charged then return false end
  end
  if not charged then return false end
  local count = redis.call('HINCRBY', C.task_failures, n, 1)
  if count < C.max_failures then return false end
  local agents = charges_of(C, n)
  redis.call('HDEL', C.task_failures, n)
  redis.call('HDEL', C.failure_charges, n)
  for _, kind in ipairs({'development', 'review', 'fix'}) do drop_task(C, kind .. ':' .. n) end
  local reason = count .. ' failed attempts (last: ' .. agent .. ', ' .. outcome
    .. '); labelled ' .. C.needs_human
  redis.call('HSET', C.K.skipped, n, cjson.encode({code = 'too_many_failures', reason = reason,
    agents = agents}))
  wait_for_person(C, n, 'needs_human', reason, now)
  audit(C, 'broker', 'needs_human', n, agent, reason, 'labelled ' .. C.needs_human)
  return true
end

-- A failure the agent reported inside the settle grace (it cannot have worked on the task):
-- free a few times in a row (a retried or concurrent request), then charged like any other
-- (a runner failing every task at once would ping-pong between issues for ever).
local function instant_failure_counts(C, agent)
  return redis.call('HINCRBY', C.instant_failures, agent, 1) > C.instant_failures_allowed
end

-- A lease's fields: {agent, token, task_id, task_type, claimed_ms, expires_ms}.
local function lease_fields(C, n)
  return redis.call('HMGET', C.lease .. n, 'agent', 'token', 'task_id', 'task_type',
    'claimed_ms', 'expires_ms')
end

-- Write a lease on issue n (lock, lease hash, leases index); returns its expiry. Every way a
-- lease starts goes through here: a claim, the sync's adoption, a rebuild after lost keys.
local function start_lease(C, n, agent, token, task_type, claimed_ms, now)
  local expires = now + C.lease_ms
  local expires_arg = arg(expires)
  redis.call('SET', C.lock .. n, agent, 'PX', C.lease_ms_arg)
  redis.call('HSET', C.lease .. n, 'agent', agent, 'token', token,
    'task_id', task_type .. ':' .. n, 'task_type', task_type,
    'claimed_ms', arg(claimed_ms), 'expires_ms', expires_arg)
  redis.call('ZADD', C.K.leases, expires_arg, n)
  return expires
end

-- Progress on the lease of issue n (kind: push | pull_request | review | note): when and what.
-- A stall flag clears.
local function record_progress(C, n, kind, what, now)
  local lease_key = C.lease .. n
  redis.call('HSET', lease_key, 'progress_ms', arg(now), 'progress', kind .. ': ' .. what)
  if redis.call('HDEL', lease_key, 'stalled') == 1 then
    timeline(C, 'unstalled', n, redis.call('HGET', lease_key, 'agent'), kind)
  end
end

-- The live lease of issue n reached a budget: the task is set aside for a person. The lease
-- lives on (nothing is killed), its agent is told `paused` at its next heartbeat, and the
-- issue waits on a person until a maintainer retries it. Returns the pause as JSON.
local function set_aside(C, n, agent, detail, now)
  local paused = cjson.encode({code = 'budget', detail = detail, at_ms = now})
  redis.call('HSET', C.lease .. n, 'paused', paused)
  wait_for_person(C, n, 'budget', detail, now)
  timeline(C, 'set_aside', n, agent, detail)
  audit(C, 'broker', 'budget', n, agent, detail, 'task set aside for a person; lease kept')
  return paused
end

-- Issue n's lease was rebuilt from GitHub's labels after Redis lost its data and its agent
-- never proved it (it let it expire, or proved another task since): most likely a task it
-- completed or gave up, whose label write was lost with Redis. Nothing is decided from timing:
-- the issue waits (`recovering`, out of the pool, labels left as they are) until the leader
-- reads GitHub (leader/progress.py): a PR for it means completed (in review), none means the
-- task returns to the pool. No failure budget is spent either way.
local function to_recovering(C, n, agent, now)
  wait_for_person(C, n, 'recovering', 'Redis lost its data: the broker reads GitHub to learn '
    .. 'whether ' .. agent .. ' completed it (a PR) or it returns to the pool', now)
  redis.call('HSET', C.recovering, n, agent)
  timeline(C, 'recovering', n, agent, 'lease rebuilt from labels, never proved')
end

-- Defined after end_lease, which calls it (and it calls end_lease).
local release_contested

-- End the lease on issue n for `outcome`; returns the agent that held it, or nil.
-- `uncounted`: a failure that is not the agent's own spends no failure budget; 'instant': a
-- failure reported inside the settle grace (see instant_failure_counts).
-- `h`: the lease's fields (lease_fields) when the caller has just read them; `current`:
-- true when the caller knows the agent's current-task key names this issue, 'kept' when
-- the caller rewrites or deletes that key itself. `detail`: why, in words (a maintainer's
-- reason), told with the 409 of a later lease call.
local function end_lease(C, n, outcome, now, uncounted, h, current, detail)
  local lease_key = C.lease .. n
  h = h or lease_fields(C, n)
  local agent, token, task_id, task_type = h[1], h[2], h[3], h[4]
  if token == ADOPTED then release_contested(C, n, agent, now) end
  redis.call('DEL', lease_key, C.lock .. n)
  redis.call('ZREM', C.K.leases, n)
  if not agent then return nil end
  local current_key = C.agent .. agent
  if current == 'kept' then
    -- The caller (claim.lua) rewrites or deletes the agent's current-task key itself.
  elseif current or redis.call('GET', current_key) == tostring(n) then
    redis.call('DEL', current_key)
  end
  local status = CANDIDATE_STATUS[outcome] or 'revoked'
  if outcome == 'completed' and task_type == 'development' then status = 'needs_review' end
  -- The task_candidate record, rewritten whole from the lease (no read of the old one); the
  -- history counts the lease's end from it (`cand`, not read again).
  local cand = {issue = tonumber(n), agent_id = agent, task_type = task_type, status = status,
    claimed_ms = tonumber(h[5]), ended_ms = now, outcome = outcome, detail = detail}
  redis.call('SET', C.cand .. n .. ':' .. agent, cjson.encode(cand), 'EX', C.cand_s_arg)
  if token ~= ADOPTED then
    local ended = outcome
    if detail and detail ~= '' then ended = outcome .. '|' .. detail end
    redis.call('SET', C.tomb .. token, ended, 'EX', C.tomb_s_arg)
    -- Every serve process remembers ended leases (claim/events.py): after Redis loses its
    -- data, a token of an ended lease is refused even though its tombstone is gone.
    redis.call('PUBLISH', C.events, 'ended\t' .. token .. '\t' .. ended)
  elseif outcome == 'expired' and task_type == 'development' then
    -- Rebuilt from labels after a loss and never proved: whether its agent completed it is
    -- read from GitHub (its PR) before it goes anywhere.
    to_recovering(C, n, agent, now)
    return agent
  end
  local add = {}
  if outcome == 'completed' and task_type == 'development' then add = {C.needs_review} end
  -- A lease rebuilt from GitHub's labels that its agent never proved (no heartbeat bound its
  -- token) most likely was not its task any more (a label removal lost with Redis): letting
  -- it expire is no failure of the agent's.
  if token == ADOPTED and outcome == 'expired' then uncounted = true end
  local counts = FAILURE[outcome] and (not uncounted
    or (uncounted == 'instant' and instant_failure_counts(C, agent)))
  local gave_up = counts and count_failure(C, n, agent, outcome, now)
  if gave_up then add = {C.needs_human} end
  want_labels(C.K.intent, C.K.outbox, n, add, {C.in_progress, agent}, now)
  -- The lease's branch, if not created yet, is not needed any more: a completing agent pushed
  -- it itself, and the next claim queues its own. Its data exists only while it is queued.
  if redis.call('ZREM', C.K.outbox, 'branch:' .. n) == 1 then
    redis.call('HDEL', C.K.outbox_data, 'branch:' .. n)
  end
  local what = task_type
  if gave_up then what = task_type .. ', labelled ' .. C.needs_human end
  if detail and detail ~= '' then what = what .. ': ' .. detail end
  timeline(C, outcome, n, agent, what, cand)
  if outcome == 'expired' and not uncounted then
    audit(C, 'broker', 'expire', n, agent, 'no heartbeat within the lease TTL',
      'lease ended; ' .. (gave_up and ('labelled ' .. C.needs_human) or 'task back in the pool'),
      nil, 'timed_out')
  end
  if gave_up then return agent end
  local parked = outcome ~= 'completed' and PARKED[waiting_code(C, n) or '']
  if outcome == 'completed' then
    -- streak_first is written only beside agent_streaks (count_failure): no streak, no first.
    if redis.call('HDEL', C.agent_streaks, agent) == 1 then
      redis.call('HDEL', C.streak_first, agent)
    end
    redis.call('HDEL', C.instant_failures, agent)
    redis.call('HDEL', C.task_failures, n)
    redis.call('HDEL', C.failure_charges, n)
    if waiting_code(C, n) == 'budget' then end_wait(C, n) end
    record_completion(C, n, agent, task_id, task_type, now)
  elseif REQUEUE[outcome] and not parked then
    if make_ready(C.K.tasks, C.K.ready, C.ready_role, task_id) then
      redis.call('PUBLISH', C.events, 'ready')
    end
  end
  if parked then return agent end
  -- Review and fix tasks of this issue that waited for the lease (posted while it was held,
  -- or the revoked lease's own) become claimable now, while the issue is still work.
  local raws = outcome ~= 'issue_closed'
    and redis.call('HMGET', C.K.tasks, 'fix:' .. n, 'review:' .. n) or {}
  if (raws[1] or raws[2]) and redis.call('ZSCORE', C.K.work, n) then
    local kinds = {'fix', 'review'}
    for i, kind in ipairs(kinds) do
      local other = kind .. ':' .. n
      if raws[i] and (other ~= task_id or outcome == 'revoked' or outcome == 'label_removed')
          and make_ready(C.K.tasks, C.K.ready, C.ready_role, other, raws[i]) then
        redis.call('PUBLISH', C.events, 'ready')
      end
    end
  end
  return agent
end

-- Issues that wait on the adopted lease of issue n (its `contested` field, written by
-- sync_upsert.lua): GitHub labels them in-progress for the same agent too, and an agent holds
-- one task. Once the agent proves n with its token, or the lease on n ends, they return to
-- the pool as a lease the agent moved on from does: labels removed, tasks ready, no failure
-- budget spent. One that has a lease by now (its labels changed, a sync put it back in the
-- pool and someone claimed it) or was closed is left alone.
release_contested = function(C, n, agent, now)
  local raw = redis.call('HGET', C.lease .. n, 'contested')
  if not raw then return end
  redis.call('HDEL', C.lease .. n, 'contested')
  for _, e in ipairs(cjson.decode(raw)) do
    local m = tostring(e.n)
    if redis.call('EXISTS', C.lock .. m) == 0 and redis.call('SISMEMBER', C.K.open, m) == 1 then
      redis.call('HDEL', C.K.skipped, m)
      end_lease(C, m, 'expired', now, true, {agent, ADOPTED, e.t .. ':' .. m, e.t, now})
    end
  end
end

-- Issue n waits in the `contested` list of `agent`'s adopted lease on another issue, and the
-- agent's own lease call on n proves n is its task: n takes the lease with the agent's token,
-- and the other issue (and any other waiting one) returns to the pool. True if so.
local function take_contested(C, n, agent, token, now)
  local m = redis.call('GET', C.agent .. agent)
  if not m or m == n or redis.call('EXISTS', C.lock .. m) == 0 then return false end
  local raw = redis.call('HGET', C.lease .. m, 'contested')
  if not raw or redis.call('EXISTS', C.cand .. n .. ':' .. agent) == 1 then return false end
  local h = lease_fields(C, m)
  if h[1] ~= agent or h[2] ~= ADOPTED then return false end
  local rest, task_type = {}, nil
  for _, e in ipairs(cjson.decode(raw)) do
    if tostring(e.n) == n then task_type = e.t else rest[#rest + 1] = e end
  end
  if not task_type then return false end
  if #rest > 0 then
    redis.call('HSET', C.lease .. m, 'contested', cjson.encode(rest))
  else
    redis.call('HDEL', C.lease .. m, 'contested')
  end
  end_lease(C, m, 'expired', now, true, h)
  start_lease(C, n, agent, token, task_type, now, now)
  redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s_arg)
  redis.call('HDEL', C.K.skipped, n)
  unready(C.K.tasks, C.K.ready, C.ready_role, task_type .. ':' .. n)
  timeline(C, 'adopted', n, agent, task_type .. ', proven by its agent; #' .. m .. ' released')
  return true
end

-- Expire leases whose lock key has timed out; bounded so a claim stays cheap.
local function reap(C, now, limit)
  local due = redis.call('ZRANGEBYSCORE', C.K.leases, '-inf', arg(now), 'LIMIT', '0', arg(limit))
  for _, n in ipairs(due) do
    local pttl = redis.call('PTTL', C.lock .. n)
    if pttl < 0 then
      end_lease(C, n, 'expired', now)
    else
      redis.call('ZADD', C.K.leases, arg(now + pttl), n)
    end
  end
  return #due
end

-- Reassignments waiting (any agent), and `agent`'s cool-downs still running, each read once
-- per script call (after any settling): while none, the rules read no reservation or
-- cool-down per task (task_verdict). reserved:{agent} is written and taken with its
-- `reservations` entry (control.lua, reservation), and a task without that entry is no
-- agent's (task_verdict): no entry, no reservation.
local function reservations_count(C)
  if C.reserving == nil then C.reserving = redis.call('ZCARD', C.reservations) end
  return C.reserving
end

local function cooling_count(C, agent, now)
  if not C.cools then return 0 end
  if C.cooling_of ~= agent then
    C.cooling = redis.call('ZCOUNT', C.cooldowns .. agent, '(' .. arg(now), '+inf')
    C.cooling_of = agent
  end
  return C.cooling
end

-- A maintainer's reassignment waiting for `agent` (reserved:{agent}), decoded, while its task
-- can still be handed out; a stale one (task gone, issue held by a lease) is dropped unless
-- `dry`. One whose issue is blocked now waits (kept, not handed out).
local function reservation(C, agent, dry)
  if reservations_count(C) == 0 then return nil end
  local raw = redis.call('GET', C.reserved .. agent)
  if not raw then return nil end
  local r = cjson.decode(raw)
  local n = tostring(r.n)
  if redis.call('EXISTS', C.lock .. n) == 0 and redis.call('HEXISTS', C.K.tasks, r.task_id) == 1
  then
    if blocker_of(C, n) then return nil end
    return r
  end
  if not dry then
    redis.call('DEL', C.reserved .. agent)
    redis.call('ZREM', C.reservations, n)
    redis.call('HDEL', C.reserved_issues, n)
  end
  return nil
end

-- Reassignments nobody claimed in time (reserved:{agent} expired): their tasks return to the
-- pool. Bounded like the lease sweep.
local function reap_reservations(C, now, limit)
  local due = redis.call('ZRANGEBYSCORE', C.reservations, '-inf', arg(now), 'LIMIT', '0',
    arg(limit))
  for _, n in ipairs(due) do
    redis.call('ZREM', C.reservations, n)
    redis.call('HDEL', C.reserved_issues, n)
    if redis.call('EXISTS', C.lock .. n) == 0 and not PARKED[waiting_code(C, n) or ''] then
      for _, kind in ipairs({'fix', 'review', 'development'}) do
        if make_ready(C.K.tasks, C.K.ready, C.ready_role, kind .. ':' .. n) then
          redis.call('PUBLISH', C.events, 'ready')
        end
      end
    end
  end
end

-- The assignment rules for one ready task and one agent (the claim's and explain's one
-- judge): nil when the claim may hand it out, else why not: 'given_up' (the task the agent
-- just gave up in this request), 'cooldown' (its cool-down on the issue: a failure, or a
-- person revoked it from the agent), 'held' (a lease holds it though it is still indexed),
-- 'reserved' (reassigned to a named agent), 'blocked' (an open or unreadable blocker: see
-- blocker_of), 'review_author' (the review of its own work while someone else may take it),
-- 'author_first' (a fix of a failing check or a conflict, offered to the PR's author alone
-- for a while). Second value: the task's value when it was read.
local function task_verdict(C, id, agent, skip_id, skip_n, now)
  local n = string.match(id, ':(%d+)$')
  if id == skip_id or n == skip_n then return 'given_up' end
  -- No cool-down can exist while cool-downs are off, nor run while the agent has none.
  if cooling_count(C, agent, now) > 0
      and (tonumber(redis.call('ZSCORE', C.cooldowns .. agent, n)) or 0) > now then
    return 'cooldown'
  end
  if redis.call('EXISTS', C.lock .. n) == 1 then return 'held' end
  -- A maintainer reassigned it: only the named agent takes it (through its reservation).
  if reservations_count(C) > 0
      and (tonumber(redis.call('ZSCORE', C.reservations, n)) or 0) > now then
    return 'reserved'
  end
  if blocker_of(C, n) then return 'blocked' end
  if string.sub(id, 1, 7) == 'review:' then
    local raw = redis.call('HGET', C.K.tasks, id)
    if raw then
      local _, _, _, author, since = task_fields(raw)
      if author == agent and since + C.author_fallback_ms > now then
        return 'review_author', raw
      end
    end
    return nil, raw
  end
  -- Checks: a fix or rebase task from CI names the PR's author, who has it alone for
  -- fix_author_ms (review fixes name nobody).
  if C.fix_author_ms > 0 and string.sub(id, 1, 4) == 'fix:' then
    local raw = redis.call('HGET', C.K.tasks, id)
    if raw then
      local _, _, _, author, since = task_fields(raw)
      if author ~= '' and author ~= agent and since + C.fix_author_ms > now then
        return 'author_first', raw
      end
    end
    return nil, raw
  end
  return nil
end

-- How many entries of one index the claim looks at for `agent`: a few pages, plus one entry
-- per task in its cool-down and per reassigned task, so that any number of them at the head
-- of the queue cannot hide the claimable ones behind them (the cost follows the agent's own
-- history and the reassignments waiting, not the backlog).
local SCAN_PAGES = 5
local function scan_limit(C, agent, scan, now)
  return 1 + scan * (SCAN_PAGES - 1) + cooling_count(C, agent, now) + reservations_count(C)
end

-- The first task of one index the agent may get, with its score and (when read) its value:
-- the head alone first (nearly always usable), then pages of `scan` entries up to `limit`.
-- A held task still indexed (a lease re-adopted by the reconciler) is dropped here unless
-- `dry`; so is a blocked one (its blocker's change indexes it again: graph_save.lua).
local function first_usable(C, src, agent, skip_id, skip_n, now, scan, limit, dry)
  local start, size = 0, 1
  while start < limit do
    local items = redis.call('ZRANGE', src, start, start + size - 1, 'WITHSCORES')
    if #items == 0 then return nil end
    start, size = start + size, scan
    for i = 1, #items, 2 do
      local id = items[i]
      local why, raw = task_verdict(C, id, agent, skip_id, skip_n, now)
      if (why == 'held' or why == 'blocked') and not dry then
        unready(C.K.tasks, C.K.ready, C.ready_role, id)
        -- The entries behind it moved up one place: the next page starts one earlier, and
        -- the scan looks at as many entries as a dry one (explain) does.
        start, limit = start - 1, limit - 1
      end
      if not why then return id, tonumber(items[i + 1]), raw end
    end
  end
  return nil
end

-- The task a claim hands `agent` from `sources` (ready or its roles' ready:{role} indexes):
-- the lowest score over them, then the lowest id. An index entry whose task value is gone
-- (the tasks hash lost alone: evicted) is dropped (unless `dry`) and the pick made again, up
-- to SCAN_PAGES times. Returns id, score, value, or nil.
local function pick_task(C, sources, agent, skip_id, skip_n, now, scan, dry)
  local limit = scan_limit(C, agent, scan, now)
  for _ = 1, SCAN_PAGES do
    local best_id, best_score, best_raw, best_src = nil, nil, nil, nil
    for _, src in ipairs(sources) do
      local id, score, raw = first_usable(C, src, agent, skip_id, skip_n, now, scan, limit, dry)
      if id and (best_score == nil or score < best_score
          or (score == best_score and id < best_id)) then
        best_id, best_score, best_raw, best_src = id, score, raw, src
      end
    end
    if best_id == nil then return nil end
    best_raw = best_raw or redis.call('HGET', C.K.tasks, best_id)
    if best_raw then return best_id, best_score, best_raw end
    if dry then return nil end
    redis.call('ZREM', C.K.ready, best_id)
    redis.call('ZREM', best_src, best_id)
  end
  return nil
end

-- The strict bucket: the most urgent priority among work issues with agent work outstanding,
-- or nil when there is none.
local function bucket_of(C)
  local top = redis.call('ZRANGE', C.K.work, 0, 0, 'WITHSCORES')
  if top[2] then return tonumber(top[2]) end
  return nil
end

-- This repository's line in the deployment's index of repositories with work (several
-- repositories only): "<1 if the mirror is rebuilt>|<bucket or ->|<1 if any task is
-- ready>|<roles with a ready task>". Kept
-- in `idx`; a change is published on the deployment's events channel, so every serve process
-- keeps its copy (repo_index.py) and a request asks only the repositories with work for it.
-- Called at the end of every script that can change the ready indexes or the bucket.
local function publish_index(C)
  if not C.indexed then return end
  local roles = {}
  for _, role in ipairs(C.roles) do
    if redis.call('EXISTS', C.ready_role .. role) == 1 then roles[#roles + 1] = role end
  end
  local bucket = bucket_of(C)
  local state = redis.call('EXISTS', C.mirror) .. '|' .. (bucket and arg(bucket) or '-') .. '|'
    .. redis.call('EXISTS', C.K.ready) .. '|' .. table.concat(roles, ',')
  if redis.call('GET', C.idx) ~= state then
    redis.call('SET', C.idx, state)
    redis.call('PUBLISH', C.events, 'idx\t' .. C.repository .. '\t' .. state)
  end
end

-- The ready indexes an agent accepting `roles` (ARGV from `first`, none: any role) takes from.
local function sources_of(C, first)
  local sources = {}
  if #ARGV >= first then
    for i = first, #ARGV do sources[#sources + 1] = C.ready_role .. ARGV[i] end
  else
    sources[1] = C.K.ready
  end
  return sources
end

-- Only the lease keys of issue n were lost (lock, lease hash, leases entry: evicted) while the
-- rest says `agent` is still at work on it: its hand-out record is still 'assigned' and the
-- mirrored issue (with the broker's unconfirmed label wishes) is labelled in-progress and with
-- the agent. No sync re-adopts it, since GitHub shows no change to re-read, so the agent's own
-- lease call rebuilds the lease with its token, as sync_upsert's adoption would. True if so.
-- Only for the token that hand-out issued (the record keeps it while assigned) and only while
-- the agent's current-task key still names n: once the agent has asked for work again (which
-- drops that key when its lease is unknown, or points it at its next task), the lost lease is
-- not its task any more, and rebuilding it would give the agent two.
local function readopt(C, n, agent, token, now)
  if redis.call('EXISTS', C.lock .. n) == 1 or mirror_missing(C) then return false end
  if redis.call('GET', C.agent .. agent) ~= tostring(n) then return false end
  local raw = redis.call('GET', C.cand .. n .. ':' .. agent)
  if not raw then return false end
  local cand = cjson.decode(raw)
  if cand.status ~= 'assigned' or cand.token ~= token
      or (cand.task_type ~= 'development' and cand.task_type ~= 'review') then
    return false
  end
  local cached = redis.call('GET', C.issue .. n)
  if not cached then return false end
  local labels = set_of(cjson.decode(cached).labels)
  local raw_intent = redis.call('HGET', C.K.intent, n)
  if raw_intent then
    local adds, removes, on = intent_sets(raw_intent)
    for l, _ in pairs(on) do adds[l] = true end
    for l, _ in pairs(adds) do labels[l] = true end
    for l, _ in pairs(removes) do labels[l] = nil end
  end
  if not labels[C.in_progress] or not labels[agent] then return false end
  start_lease(C, n, agent, token, cand.task_type, cand.claimed_ms or now, now)
  redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s_arg)
  unready(C.K.tasks, C.K.ready, C.ready_role, cand.task_type .. ':' .. n)
  timeline(C, 'adopted', n, agent, cand.task_type .. ', lease keys lost, rebuilt')
  return true
end

-- Redis restarted with data from before (its persistence file, a replica) and the leader has
-- not checked it yet (store/mirror.py check_server drops it and rebuilds from GitHub): a lease
-- that data does not know may well be live on GitHub. Only asked on the way to a refusal:
-- INFO is not cheap. False where INFO is not served (fakeredis) or nothing was recorded.
local function server_changed(C)
  local recorded = redis.call('GET', C.server)
  if not recorded then return false end
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return false end
  local run_id = string.match(info, 'run_id:(%x+)')
  return run_id ~= nil and run_id ~= string.match(recorded, '^(%x+)')
end

-- After Redis lost its data, which grant wins: the latest. A proof is {task_type, claimed_ms,
-- memory}: what a valid signed token grants, and what the serving process remembers of it
-- ('live': it has heard of every lease end since before that claim, and not of this one's;
-- otherwise 'unknown'). Claims made after the loss are newer than any token from before it,
-- so these rules only ever decide between leases rebuilt after a loss.

-- Whether a proof for issue n displaces the lease `h` ({agent, token, claimed_ms}) another
-- agent holds there: a lease rebuilt from labels only when the process knows the proof's
-- lease is live (labels lag a write outage); a lease proven by a token when the proof's claim
-- is later (the same issue can only have been granted again after the older lease ended).
local function displaces(h, proof)
  if h[2] == ADOPTED then return proof[3] == 'live' end
  return tonumber(proof[2]) > (tonumber(h[3]) or 0)
end

-- The agent proved issue n, a newer task than its lease on m (rebuilt from labels or proven
-- earlier): it moved on from m, which its claim of n settled before the loss. m ends; a
-- development task waits for the leader to read GitHub (to_recovering), any other returns.
local function moved_on_from(C, m, hm, now, current)
  end_lease(C, m, 'revoked', now, true, hm, current, 'its agent proved a newer task')
  if hm[4] == 'development' then
    unready(C.K.tasks, C.K.ready, C.ready_role, 'development:' .. m)
    to_recovering(C, m, hm[1], now)
  end
end

-- A lease claimed this long before the rebuild after a loss read GitHub's labels
-- (`labels_read_ms`, sync_save.lua) would show its labels there if it were live; when GitHub
-- does not label it for the agent and the serving process cannot vouch for it, it ended.
local LABELS_LAND_MS = 120000

-- Redis lost the lease of issue n (with everything else) and the agent's lease call carries
-- a token the broker signed for exactly this lease (tokens.py checked it). The lease is
-- rebuilt with that token unless: the issue is not open here or has no such task; the agent
-- holds a newer lease here (refused: superseded); the claim is older than LABELS_LAND_MS
-- before the rebuild read the labels, GitHub did not label it (it would hold a lease rebuilt
-- from them), and the serving process cannot vouch for it.
-- An older lease of the agent's here ends (moved_on_from). Returns true, or false and the
-- refusal ('' for the caller's own).
local function adopt_proven(C, n, agent, token, proof, now)
  if not proof or mirror_missing(C) or redis.call('EXISTS', C.lock .. n) == 1 then
    return false, ''
  end
  -- The rules must still allow the task (a lease that ended before the loss, its issue in
  -- review since, proves nothing now).
  if redis.call('SISMEMBER', C.K.open, n) == 0
      or redis.call('HEXISTS', C.K.tasks, proof[1] .. ':' .. n) == 0 then
    return false, ''
  end
  local claimed = tonumber(proof[2]) or now
  local read = tonumber(redis.call('HGET', C.sync, 'labels_read_ms'))
  if proof[3] ~= 'live' and read and claimed < read - LABELS_LAND_MS then
    return false, 'expired|its lease ended before Redis lost its data'
  end
  local m = redis.call('GET', C.agent .. agent)
  if m and m ~= n and redis.call('EXISTS', C.lock .. m) == 1 then
    local hm = lease_fields(C, m)
    if hm[1] == agent then
      if hm[2] ~= ADOPTED and (tonumber(hm[5]) or 0) >= claimed then
        return false, 'revoked|superseded: ' .. agent .. ' holds a newer task, #' .. m
      end
      moved_on_from(C, m, hm, now, true)
    end
  end
  start_lease(C, n, agent, token, proof[1], claimed, now)
  redis.call('HSET', C.lease .. n, 'proven', '1')
  redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s_arg)
  redis.call('HDEL', C.K.skipped, n)
  unready(C.K.tasks, C.K.ready, C.ready_role, proof[1] .. ':' .. n)
  want_labels(C.K.intent, C.K.outbox, n, {C.in_progress, agent}, {}, now)
  timeline(C, 'adopted', n, agent, proof[1] .. ', proven by its signed token')
  audit(C, 'broker', 'adopt', n, agent, 'Redis lost the lease; the agent proved it',
    'lease rebuilt from the signed token')
  return true
end

-- Check that `token` is the live lease of `agent` on issue n; `proof`: {task_type,
-- claimed_ms} when the caller presented a valid signed token for exactly this lease.
-- Returns nil when it is, else the reason the caller gets with its 409 (`reason|detail` when
-- the lease ended with a reason in words, e.g. a maintainer's revoke).
local lease_refusal_of
local function lease_refusal(C, n, agent, token, now, proof)
  local reason = lease_refusal_of(C, n, agent, token, now, proof)
  if reason and reason ~= 'rebuilding' and server_changed(C) then return 'rebuilding' end
  return reason
end

lease_refusal_of = function(C, n, agent, token, now, proof)
  local h = redis.call('HMGET', C.lease .. n, 'agent', 'token')
  local ended = redis.call('GET', C.tomb .. token)
  if h[2] == ADOPTED and h[1] == agent and not ended and redis.call('EXISTS', C.lock .. n) == 1 then
    -- The agent is still at work on a lease rebuilt from GitHub: its token becomes the lease's,
    -- unless the hand-out's record survived and names another token (a stale or made-up one).
    local rec = redis.call('GET', C.cand .. n .. ':' .. agent)
    local issued = rec and cjson.decode(rec).token
    if issued and issued ~= token then return 'revoked' end
    -- An older token while the agent proved a newer task: n is one it moved on from.
    local m = redis.call('GET', C.agent .. agent)
    if proof and m and m ~= n and redis.call('EXISTS', C.lock .. m) == 1 then
      local hm = lease_fields(C, m)
      if hm[1] == agent and hm[2] ~= ADOPTED and (tonumber(hm[5]) or 0) >= tonumber(proof[2]) then
        moved_on_from(C, n, lease_fields(C, n), now, nil)
        return 'revoked|superseded: ' .. agent .. ' holds a newer task, #' .. m
      end
    end
    redis.call('HSET', C.lease .. n, 'token', token)
    release_contested(C, n, agent, now)
    return nil
  end
  if h[2] == token then
    if h[1] ~= agent then return 'not_owner' end
    if redis.call('EXISTS', C.lock .. n) == 0 then
      end_lease(C, n, 'expired', now)
      return 'expired'
    end
    return nil
  end
  if ended then return ended end
  if h[1] and h[1] ~= agent then
    -- A lease rebuilt after a loss gives way to a newer grant of the same issue.
    local hn = redis.call('HMGET', C.lease .. n, 'agent', 'token', 'claimed_ms')
    if not proof or not displaces(hn, proof) or redis.call('EXISTS', C.lock .. n) == 0 then
      return 'not_owner'
    end
    end_lease(C, n, 'revoked', now, true, lease_fields(C, n), nil,
      'a newer grant of the issue was proved after Redis lost its data')
    h = {}
  end
  if h[1] == agent then return 'revoked' end
  if not h[1] then
    if readopt(C, n, agent, token, now) or take_contested(C, n, agent, token, now) then
      return nil
    end
    local adopted, refused = adopt_proven(C, n, agent, token, proof, now)
    if adopted then return nil end
    if refused ~= '' then return refused end
  end
  if mirror_missing(C) then return 'rebuilding' end
  -- No trace of a hand-out of n to this agent: it never held it (or long ago).
  if redis.call('EXISTS', C.cand .. n .. ':' .. agent) == 0 then return 'not_leased' end
  return 'expired'
end
