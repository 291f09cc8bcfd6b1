-- sync_upsert.lua: write a batch of open issues from GitHub and re-index them.
-- KEYS, ARGV[1]: see _lib.lua.
-- ARGV[2]: JSON list of {n, issue (JSON text), prio (-1: not work), task ('' or task id),
--   score, role, branch, skip ('' or the reason it is not assignable), holder (the agent
--   named by the issue's labels, or ''), pin (false: left out of the strict bucket),
--   removed_by ('' unknown, 'person' or 'broker': who removed the lease's labels, when an
--   earlier call reported the issue as a suspect), others (labels that are neither
--   priority, role nor the broker's own: maybe agent ids), orphan (why it is skipped while
--   in-progress with no live lease), stray (a label naming an agent that is not configured:
--   removed with an orphan's in-progress)}.
-- ARGV[3]: now as ISO 8601 UTC. ARGV[4]: the caller's leader epoch (error FENCED when
--   another process leads now: a stalled ex-leader's page never lands).
-- An issue GitHub shows in-progress without a live lease is re-adopted for its holder: the
-- lease is rebuilt with a placeholder token that the agent's next heartbeat replaces (the
-- hand-out's own token, when its task_candidate record still has it); if the agent is gone
-- the lease simply expires and the task returns to the pool. Not when the hand-out's record
-- survived and the holder's current-task key no longer names the issue (it asked for other
-- work since): that hand-out ends, and the issue returns to the pool. An agent gets one lease:
-- if it holds a lease its token proved on another issue, this one ends the same way; if that
-- lease is adopted too, one of them waits in the lease's `contested` list (see contest).
-- needs-review starts the review timer (review_issue_detected_timestamp) the first time it
-- is seen and clears it, the review state and any review/fix task when it goes.
-- Labels the broker wrote and GitHub does not show yet (the intent) count as present,
-- so a sync racing the write queue never re-offers an issue that was just claimed or
-- completed. An intent GitHub shows in full is dropped: from then on GitHub is the truth.
-- Labels written (on) that GitHub does not show while no write is queued (a late write of a
-- deposed leader undid them, or the page predates the write) are written again.
-- A live lease whose in-progress or agent label vanished from GitHub is a suspect: the
-- caller asks GitHub who removed it and calls again with removed_by. A person's edit revokes
-- the lease (label_removed); the broker's own late write is undone (the labels re-applied).
-- A label naming an agent that held the issue before (its task_candidate record exists) and
-- holds no live lease on it now is removed: a deposed leader's late write put it back.
-- An issue in-progress with no single agent label and no lease (an orphan) gets its
-- in-progress label (and `stray`) removed once it stayed so for the lease TTL: it
-- returns to the pool.
-- Returns {issues written, tasks made ready, leases revoked, leases adopted,
--   JSON list of suspects {n, missing labels}, labels re-applied, JSON list of the agents
--   adopted (the caller points each at this repository: see agent_repos)}.
-- Items older than the cache or than issue_version:{n} are skipped and not counted.
-- Whether `agent` held issue n before and that hand-out ended (its record is not 'assigned').
local function handed_back(C, n, agent)
  local raw = redis.call('GET', C.cand .. n .. ':' .. agent)
  return raw ~= false and raw ~= nil and cjson.decode(raw).status ~= 'assigned'
end

-- The hand-out record of `agent` on issue n, whose lease keys were lost, when the agent has
-- moved on from it: the record is still here (so Redis did not lose everything), yet the
-- agent's current-task key no longer names n. Any request of the agent since (in any
-- repository: with several, each request settles in all of them) has rewritten or dropped
-- that key. Without the record (Redis lost its data) nothing tells: nil, and the holder is
-- adopted.
local function moved_on(C, n, agent)
  local raw = redis.call('GET', C.cand .. n .. ':' .. agent)
  if not raw or redis.call('GET', C.agent .. agent) == n then return nil end
  return cjson.decode(raw)
end

-- The live lease `agent` holds on an issue other than n (its current-task key names it): that
-- issue's number and the lease's token, or nil.
local function other_lease(C, n, agent)
  local m = redis.call('GET', C.agent .. agent)
  if not m or m == n or redis.call('EXISTS', C.lock .. m) == 0 then return nil end
  local h = redis.call('HMGET', C.lease .. m, 'agent', 'token')
  if h[1] ~= agent then return nil end
  return m, h[2]
end

local function waiting_reason(agent, other)
  return cjson.encode({code = 'contested', reason = 'labelled in-progress for ' .. agent
    .. ', who is labelled in-progress on #' .. other .. ' too (an agent holds one task): '
    .. 'waits for its next heartbeat, or for that lease to end'})
end

-- GitHub labels issue n in-progress for `agent`, which already holds an adopted lease (not
-- proven by its token yet) on issue m: both were rebuilt from labels after Redis lost its
-- data, and one of them is stale (a completion or release whose label write was lost with
-- Redis). An agent holds one lease: the issue GitHub changed last (most likely the later
-- claim) holds it and the other waits in the lease's `contested` list, out of the pool, until
-- the agent's next lease call tells which one it works on (_lib.lua: take_contested,
-- release_contested). Returns true when n took the lease.
local function contest(C, n, m, agent, task_type, updated_at, now)
  local list = cjson.decode(redis.call('HGET', C.lease .. m, 'contested') or '[]')
  for _, e in ipairs(list) do
    if tostring(e.n) == n then return false end
  end
  local cached = redis.call('GET', C.issue .. m)
  if not cached or updated_at <= cjson.decode(cached).updated_at then
    list[#list + 1] = {n = tonumber(n), t = task_type}
    redis.call('HSET', C.lease .. m, 'contested', cjson.encode(list))
    return false
  end
  -- n takes the lease; m waits with the others (nothing ended: nobody has worked on either
  -- lease since the rebuild).
  list[#list + 1] = {n = tonumber(m), t = redis.call('HGET', C.lease .. m, 'task_type')}
  redis.call('DEL', C.lease .. m, C.lock .. m)
  redis.call('ZREM', C.K.leases, m)
  start_lease(C, n, agent, ADOPTED, task_type, now, now)
  redis.call('HSET', C.lease .. n, 'contested', cjson.encode(list))
  redis.call('SET', C.agent .. agent, n, 'EX', C.agent_s)
  redis.call('HSET', C.K.skipped, m, waiting_reason(agent, n))
  return true
end

local C = context()
local fenced = fence(C, ARGV[4])
if fenced then return fenced end
-- An item older than the cached issue (by updated_at) is skipped: a late webhook delivery
-- or a listing read before a newer write never rolls the mirror back.
local items = {}
-- The item's issue is decoded once here (it.doc); an item equal to its cache (the full pass
-- indexing a page GitHub answered 304 from the cache) is kept without decoding the cache.
-- The same holds for the newest state a webhook delivery applied (issue_version:{n}, '~' once
-- deleted or transferred): after a delivered close removed the issue there is no cache to
-- compare with, and a page read just before the close must not put it back in the pool.
for _, it in ipairs(cjson.decode(ARGV[2])) do
  local cached = redis.call('GET', C.issue .. tostring(it.n))
  it.doc = cjson.decode(it.issue)
  local version = redis.call('GET', C.version .. tostring(it.n))
  if (not version or it.doc.updated_at >= version) and (not cached or cached == it.issue
      or it.doc.updated_at >= cjson.decode(cached).updated_at)
  then
    it.cached = cached
    items[#items + 1] = it
  end
end
local now = now_ms()
local now_iso = ARGV[3]
local written, readied, revoked, adopted, restored = 0, 0, 0, 0, 0
local suspects = {}
local holders = {}
for _, it in ipairs(items) do
  local n = tostring(it.n)
  local ikey = C.issue .. n
  if it.cached ~= it.issue then
    redis.call('SET', ikey, it.issue)
    written = written + 1
  end
  redis.call('SADD', C.K.open, n)
  -- Dependencies: an issue with an open or unreadable blocker is claimable by no one and
  -- holds no bucket (blocker_of; the claim judges again at the hand-out).
  local blocked = blocker_of(C, n) ~= nil
  -- it.pin is false for work nobody can take (body skipped), unless settings say it counts.
  -- An issue that waits on a person keeps out of the bucket (wait_for_person), at its
  -- priority of now.
  local waits = redis.call('HGET', C.waiting, n)
  if waits then
    local w = cjson.decode(waits)
    if w.prio ~= it.prio then
      w.prio = it.prio
      redis.call('HSET', C.waiting, n, cjson.encode(w))
    end
  end
  if it.prio >= 0 and it.pin ~= false and (not waits or C.people_hold) and not blocked then
    redis.call('ZADD', C.K.work, it.prio, n)
  else
    redis.call('ZREM', C.K.work, n)
  end
  -- A lease whose lock timed out before the reaper came by ends here first, so it is not
  -- mistaken for work GitHub shows in progress without a lease.
  if redis.call('EXISTS', C.lock .. n) == 0 and redis.call('EXISTS', C.lease .. n) == 1 then
    end_lease(C, n, 'expired', now)
  end

  local on_github = set_of(it.doc.labels)
  local labels = set_of(it.doc.labels)
  local raw_intent = redis.call('HGET', C.K.intent, n)
  if raw_intent then
    -- Wished (add) or already written (on) labels count as present, unless removed since.
    local adds, removes, on = intent_sets(raw_intent)
    for l, _ in pairs(on) do adds[l] = true end
    local seen = true
    for l, _ in pairs(adds) do
      if not removes[l] then
        if not on_github[l] then seen = false end
        labels[l] = true
      end
    end
    for l, _ in pairs(removes) do
      if on_github[l] then seen = false end
      labels[l] = nil
    end
    -- Drop it only when no write is queued: a page read before the last write was made can
    -- "show" an older wish and must not cancel the newer one.
    local queued = redis.call('ZSCORE', C.K.outbox, 'labels:' .. n)
    if seen and not queued then
      redis.call('HDEL', C.K.intent, n)
    elseif not queued then
      -- Written (on) but not on GitHub with no write queued: the page predates the write, or
      -- a deposed leader's late removal undid it. Writing it again is idempotent either way.
      local redo = {}
      for l, _ in pairs(on) do
        if not removes[l] and not on_github[l] then redo[#redo + 1] = l end
      end
      if #redo > 0 then want_labels(C.K.intent, C.K.outbox, n, redo, {}, now) end
    end
  end

  local held = redis.call('EXISTS', C.lock .. n) == 1
  -- The issue whose adopted lease this one waits on (see contest), or nil.
  local contested = nil
  if held then
    local reason = nil
    if it.prio < 0 then
      reason = 'label_removed'
    else
      local agent = redis.call('HGET', C.lease .. n, 'agent')
      -- Labels the broker wished or wrote and no sync confirmed yet are not "removed".
      local pending = {}
      if raw_intent then
        local adds, _, on = intent_sets(raw_intent)
        for l, _ in pairs(adds) do pending[l] = true end
        for l, _ in pairs(on) do pending[l] = true end
      end
      local missing = {}
      for _, l in ipairs({C.in_progress, agent}) do
        if l and not on_github[l] and not pending[l] then missing[#missing + 1] = l end
      end
      if #missing > 0 then
        if it.removed_by == 'person' then
          reason = 'label_removed'
        elseif it.removed_by == 'broker' then
          want_labels(C.K.intent, C.K.outbox, n, {C.in_progress, agent}, {}, now)
          labels[C.in_progress] = true
          restored = restored + 1
        else
          suspects[#suspects + 1] = {n = it.n, missing = missing}
        end
      end
    end
    if reason then
      end_lease(C, n, reason, now)
      revoked = revoked + 1
      held = false
    end
  elseif labels[C.in_progress] and it.holder ~= '' and it.prio >= 0 and not raw_intent
      and not handed_back(C, n, it.holder) then
    -- Not while the broker's own label writes are unconfirmed: the page may predate a
    -- removal the write queue already made (the intent no longer lists applied removals).
    local left = moved_on(C, n, it.holder)
    local task_type = 'development'
    if labels[C.needs_review] then task_type = 'review' end
    local other, other_token = nil, nil
    if not left then other, other_token = other_lease(C, n, it.holder) end
    if other and other_token ~= ADOPTED then
      -- The holder proved its lease on the other issue with its token (or claimed it since):
      -- this one is not its task (an agent holds one); it ends as below.
      left = {token = ADOPTED, task_type = task_type, claimed_ms = now}
    end
    if left then
      -- Its lease keys alone were lost and the holder has asked for other work since: this
      -- one is not its task any more (an agent holds one). The hand-out ends as an expired
      -- lease does (its record, its token's tombstone, its labels, the task back in the
      -- pool), but spends no failure budget: losing the keys was not the agent's doing.
      end_lease(C, n, 'expired', now, true,
        {it.holder, left.token or ADOPTED, left.task_type .. ':' .. n, left.task_type,
         left.claimed_ms})
      labels[C.in_progress] = nil
      labels[it.holder] = nil
    elseif other and not contest(C, n, other, it.holder, task_type, it.doc.updated_at, now) then
      contested = other
    else
      if not other then
        start_lease(C, n, it.holder, ADOPTED, task_type, now, now)
        redis.call('SET', C.agent .. it.holder, n, 'EX', C.agent_s, 'NX')
      end
      adopted = adopted + 1
      holders[#holders + 1] = it.holder
      held = true
    end
  end

  local holder_now = held and redis.call('HGET', C.lease .. n, 'agent') or nil
  local stale = {}
  for _, l in ipairs(it.others or {}) do
    if labels[l] and l ~= holder_now and redis.call('EXISTS', C.cand .. n .. ':' .. l) == 1 then
      stale[#stale + 1] = l
      labels[l] = nil
    end
  end
  if #stale > 0 then
    if not held and labels[C.in_progress] and it.holder ~= '' and labels[it.holder] == nil then
      -- The in-progress label came back with the past holder's: neither is anyone's now.
      stale[#stale + 1] = C.in_progress
      labels[C.in_progress] = nil
    end
    want_labels(C.K.intent, C.K.outbox, n, {}, stale, now)
  end

  if not held and on_github[C.in_progress] and labels[C.in_progress] and it.holder == ''
      and it.prio >= 0 then
    local first = tonumber(redis.call('HGET', C.orphans, n))
    if not first then
      redis.call('HSET', C.orphans, n, now)
    elseif now - first >= C.lease_ms then
      local gone = {C.in_progress}
      for _, l in ipairs(it.stray or {}) do gone[#gone + 1] = l end
      want_labels(C.K.intent, C.K.outbox, n, {}, gone, now)
      redis.call('HDEL', C.orphans, n)
    end
  else
    redis.call('HDEL', C.orphans, n)
  end

  if labels[C.needs_review] then
    redis.call('SADD', C.K.reviewing, n)
    redis.call('SET', C.review .. n, now_iso, 'NX')
  elseif redis.call('SREM', C.K.reviewing, n) == 1 then
    redis.call('DEL', C.review .. n, C.review_state .. n)
    drop_task(C, 'review:' .. n)
    drop_task(C, 'fix:' .. n)
    if waiting_code(C, n) == 'awaiting_feedback' then end_wait(C, n) end
  end
  -- needs-human (on GitHub, or queued by the failure budget): the issue waits on a person
  -- until somebody removes the label.
  local code = waiting_code(C, n)
  if labels[C.needs_human] then
    if code ~= 'needs_human' and not PARKED[code or ''] then
      wait_for_person(C, n, 'needs_human', 'labelled ' .. C.needs_human, now)
    end
  elseif code == 'needs_human' then
    end_wait(C, n)
  end
  -- A maintainer held it, or a budget was reached: no task is handed out until a retry.
  local parked = PARKED[waiting_code(C, n) or '']

  -- Review and fix tasks of an issue that stopped being work (needs-human, priority or role
  -- gone) wait out of the pool; they return below if it becomes work again.
  if it.prio < 0 then
    for _, kind in ipairs({'fix', 'review'}) do
      unready(C.K.tasks, C.K.ready, C.ready_role, kind .. ':' .. n)
    end
  end
  if blocked then
    for _, kind in ipairs({'fix', 'review', 'development'}) do
      unready(C.K.tasks, C.K.ready, C.ready_role, kind .. ':' .. n)
    end
  end
  -- ready = tasks - held - blocked, for review and fix tasks too.
  if not held and not parked and not blocked and it.prio >= 0 and not labels[C.in_progress] then
    for _, kind in ipairs({'fix', 'review'}) do
      make_ready(C.K.tasks, C.K.ready, C.ready_role, kind .. ':' .. n)
    end
  end

  local id = 'development:' .. n
  -- While a lease is live, in-progress is the lease's own label: the task stays known, so
  -- the moment the lease ends (expired, released) it is claimable again.
  -- needs-human the broker queued itself (failure budget) counts before GitHub shows it.
  local eligible = it.task ~= '' and not labels[C.needs_review] and not labels[C.needs_human]
    and (held or contested or not labels[C.in_progress])
  if eligible then
    local old = redis.call('HGET', C.K.tasks, id)
    local since = now
    if old then
      local _, _, _, _, old_since = task_fields(old)
      since = old_since
    end
    local value = task_value(it.score, it.role, '', '', since, it.branch)
    if old ~= value then
      if old then unready(C.K.tasks, C.K.ready, C.ready_role, id) end
      redis.call('HSET', C.K.tasks, id, value)
    end
    if not held and not contested and not parked and not blocked then
      if redis.call('ZADD', C.K.ready, it.score, id) == 1 then readied = readied + 1 end
      redis.call('ZADD', C.ready_role .. it.role, it.score, id)
    end
  else
    unready(C.K.tasks, C.K.ready, C.ready_role, id)
    redis.call('HDEL', C.K.tasks, id)
  end

  local gave_up = labels[C.needs_human] and string.find(
    redis.call('HGET', C.K.skipped, n) or '', '"too_many_failures"', 1, true)
  if gave_up then
    -- Keep the failure budget's reason while its needs-human label is on.
  elseif it.skip ~= '' then
    redis.call('HSET', C.K.skipped, n, it.skip)
  elseif contested then
    redis.call('HSET', C.K.skipped, n, waiting_reason(it.holder, contested))
  elseif it.task ~= '' and labels[C.in_progress] and not held then
    local why = it.orphan
    if not why or why == '' then why = 'labelled in-progress on GitHub with no live lease' end
    redis.call('HSET', C.K.skipped, n, cjson.encode({code = 'held_on_github', reason = why}))
  else
    redis.call('HDEL', C.K.skipped, n)
  end
end
if readied > 0 then redis.call('PUBLISH', C.events, 'ready') end
publish_index(C)
local suspects_json = '[]'
if #suspects > 0 then suspects_json = cjson.encode(suspects) end
local holders_json = '[]'
if #holders > 0 then holders_json = cjson.encode(holders) end
return {written, readied, revoked, adopted, suspects_json, restored, holders_json}
