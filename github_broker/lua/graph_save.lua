-- graph_save.lua: what the leader learnt of GitHub's dependency graph for this repository.
-- KEYS, ARGV[1]: see _lib.lua.
-- ARGV[2]: JSON {links = {n: [blocker refs]} (an issue's blockers as GitHub listed them now;
--   [] none), states = {ref: state} (what a blocker is now: open | completed | not_planned |
--   duplicate | unserved), gone = [n] (issues no longer open here: their links, order and
--   verdict are dropped), order = {n: {parent, pos, base_s} or false} (sub-issues' places in
--   their parents' order), cycles = {n: [refs]} (when given: every cycle on this repository
--   now, replacing the last)}.
-- ARGV[3]: the caller's leader epoch (error FENCED when another process leads now).
-- Then each issue whose links changed, or that depends on a blocker whose state was given, is
-- judged again (blocker_of, the claim's own rule) against graph:blocked, the last verdict: a
-- change is a timeline event (`blocked` by whom, `unblocked`), and a live lease on the issue
-- is told as dependencies.after_handout says: a note at the agent's next heartbeat, its task
-- paused (waiting_for_user until the blocker closes), or the lease revoked.
-- Returns JSON [{n, ref, state, changed}] for those issues (ref and state absent when nothing
-- blocks it): the caller indexes the changed ones again (sync_upsert.lua puts a blocked task
-- out of the pool and an unblocked one back).
local C = context()
local fenced = fence(C, ARGV[3])
if fenced then return fenced end
local req = cjson.decode(ARGV[2])
local now = now_ms()
local touched = {}

-- The reverse index: `n` joins (or leaves) the dependents of `ref`; a ref nobody here depends
-- on any more leaves graph:state too.
local function dependents(ref, n, join)
  local list = cjson.decode(redis.call('HGET', C.dependents, ref) or '[]')
  local kept = {}
  for _, m in ipairs(list) do
    if tostring(m) ~= n then kept[#kept + 1] = m end
  end
  if join then kept[#kept + 1] = tonumber(n) end
  if #kept > 0 then
    redis.call('HSET', C.dependents, ref, cjson.encode(kept))
  else
    redis.call('HDEL', C.dependents, ref)
    redis.call('HDEL', C.dep_state, ref)
  end
end

local function set_links(n, refs)
  local old = redis.call('HGET', C.deps, n)
  for _, ref in ipairs(old and cjson.decode(old) or {}) do dependents(ref, n, false) end
  if #refs > 0 then
    redis.call('HSET', C.deps, n, cjson.encode(refs))
    for _, ref in ipairs(refs) do dependents(ref, n, true) end
  else
    redis.call('HDEL', C.deps, n)
  end
end

for _, m in ipairs(req.gone or {}) do
  local n = tostring(m)
  set_links(n, {})
  redis.call('HDEL', C.blocked, n)
  redis.call('HDEL', C.order, n)
  redis.call('HDEL', C.cycles, n)
end
for n, refs in pairs(req.links or {}) do
  set_links(n, refs)
  touched[n] = true
end
for ref, state in pairs(req.states or {}) do
  local raw = redis.call('HGET', C.dependents, ref)
  if raw and redis.call('HGET', C.dep_state, ref) ~= state then
    redis.call('HSET', C.dep_state, ref, state)
    for _, m in ipairs(cjson.decode(raw)) do touched[tostring(m)] = true end
  end
end
for n, place in pairs(req.order or {}) do
  if place then
    redis.call('HSET', C.order, n, cjson.encode(place))
  else
    redis.call('HDEL', C.order, n)
  end
end
if req.cycles then
  redis.call('DEL', C.cycles)
  for n, refs in pairs(req.cycles) do redis.call('HSET', C.cycles, n, cjson.encode(refs)) end
end

-- Add a note for the holder of issue n (delivered with its next heartbeat, as a maintainer's).
local function note(n, text)
  local notes = cjson.decode(redis.call('HGET', C.lease .. n, 'notes') or '[]')
  if #notes >= 20 then table.remove(notes, 1) end
  notes[#notes + 1] = {by = 'broker', text = text, at_ms = now}
  redis.call('HSET', C.lease .. n, 'notes', cjson.encode(notes))
end

-- A live lease on issue n whose verdict just changed: told, paused or revoked.
local function flag(n, ref, state)
  if redis.call('EXISTS', C.lock .. n) == 0 then return end
  local h = lease_fields(C, n)
  if not h[1] then return end
  if not ref then
    local paused = redis.call('HGET', C.lease .. n, 'paused')
    if paused and cjson.decode(paused).code == 'blocked' then
      redis.call('HDEL', C.lease .. n, 'paused')
    end
    note(n, 'no longer blocked: every blocker of #' .. n .. ' is closed')
    return
  end
  local why = '#' .. n .. ' is blocked by ' .. ref .. ' (' .. state .. ')'
  if C.after_handout == 'revoke' then
    end_lease(C, n, 'revoked', now, true, h, nil, why)
    audit(C, 'broker', 'blocked', n, h[1], why, 'lease revoked')
  elseif C.after_handout == 'pause' then
    redis.call('HSET', C.lease .. n, 'paused',
      cjson.encode({code = 'blocked', detail = why, at_ms = now}))
    audit(C, 'broker', 'blocked', n, h[1], why, 'task paused until the blocker closes')
  else
    note(n, why .. ': it was linked after you took it; finish only what does not need it')
    audit(C, 'broker', 'blocked', n, h[1], why, 'holder told at its next heartbeat')
  end
end

local out = {}
for n, _ in pairs(touched) do
  local ref, state = blocker_of(C, n)
  local verdict = ref and (ref .. ' ' .. state) or nil
  local changed = verdict ~= redis.call('HGET', C.blocked, n)
  if changed and redis.call('SISMEMBER', C.K.open, n) == 1 then
    if verdict then
      redis.call('HSET', C.blocked, n, verdict)
      timeline(C, 'blocked', n, '', 'by ' .. ref .. ' (' .. state .. ')')
    else
      redis.call('HDEL', C.blocked, n)
      timeline(C, 'unblocked', n, '', 'no open blocker left')
    end
    flag(n, ref, state)
  end
  out[#out + 1] = {n = tonumber(n), ref = ref, state = state, changed = changed}
end
publish_index(C)
if #out == 0 then return '[]' end
return cjson.encode(out)
