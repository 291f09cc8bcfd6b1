-- sync_upsert.lua: write a batch of open issues from GitHub and re-index them.
-- KEYS, ARGV[1]: see _lib.lua.
-- ARGV[2]: JSON list of {n, issue (JSON text), prio (-1: not work), task ('' or task id),
--   score, role, branch, skip ('' or the reason it is not assignable)}.
-- Labels the broker wrote and GitHub does not show yet (the intent) count as present,
-- so a sync racing the write queue never re-offers an issue that was just claimed or
-- completed. An intent GitHub shows in full is dropped: from then on GitHub is the truth.
-- Returns {issues written, tasks made ready, leases revoked}.
local C = context()
local items = cjson.decode(ARGV[2])
local now = now_ms()
local written, readied, revoked = 0, 0, 0
for _, it in ipairs(items) do
  local n = tostring(it.n)
  local ikey = C.issue .. n
  if redis.call('GET', ikey) ~= it.issue then
    redis.call('SET', ikey, it.issue)
    written = written + 1
  end
  redis.call('SADD', C.K.open, n)
  if it.prio >= 0 then redis.call('ZADD', C.K.work, it.prio, n) else redis.call('ZREM', C.K.work, n) end

  local on_github = set_of(cjson.decode(it.issue).labels)
  local labels = set_of(cjson.decode(it.issue).labels)
  local raw_intent = redis.call('HGET', C.K.intent, n)
  if raw_intent then
    local intent = cjson.decode(raw_intent)
    local seen = true
    for _, l in ipairs(intent.add or {}) do
      if not on_github[l] then seen = false end
      labels[l] = true
    end
    for _, l in ipairs(intent.remove or {}) do
      if on_github[l] then seen = false end
      labels[l] = nil
    end
    if seen then redis.call('HDEL', C.K.intent, n) end
  end

  local held = redis.call('EXISTS', C.lock .. n) == 1
  if held then
    local task_type = redis.call('HGET', C.lease .. n, 'task_type')
    local reason = nil
    if it.prio < 0 then
      reason = 'label_removed'
    elseif not raw_intent and task_type == 'development' and not on_github[C.in_progress] then
      -- Our in-progress label was seen before (no intent left) and is gone: a person removed it.
      reason = 'label_removed'
    end
    if reason then
      end_lease(C, n, reason, now)
      revoked = revoked + 1
      held = false
    end
  end

  local id = 'development:' .. n
  local eligible = it.task ~= '' and not labels[C.in_progress] and not labels[C.needs_review]
  if eligible then
    local value = it.score .. '|' .. it.role .. '|' .. it.branch
    local old = redis.call('HGET', C.K.tasks, id)
    if old ~= value then
      if old then unready(C.K.tasks, C.K.ready, C.ready_role, id) end
      redis.call('HSET', C.K.tasks, id, value)
    end
    if not held then
      if redis.call('ZADD', C.K.ready, it.score, id) == 1 then readied = readied + 1 end
      redis.call('ZADD', C.ready_role .. it.role, it.score, id)
    end
  else
    unready(C.K.tasks, C.K.ready, C.ready_role, id)
    redis.call('HDEL', C.K.tasks, id)
  end

  if it.skip ~= '' then
    redis.call('HSET', C.K.skipped, n, it.skip)
  elseif it.task ~= '' and labels[C.in_progress] and not held then
    redis.call('HSET', C.K.skipped, n, cjson.encode({
      code = 'held_on_github', reason = 'labelled in-progress on GitHub but no live lease'}))
  else
    redis.call('HDEL', C.K.skipped, n)
  end
end
if readied > 0 then redis.call('PUBLISH', C.events, 'ready') end
return {written, readied, revoked}
