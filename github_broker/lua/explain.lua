-- explain.lua: what claim.lua would decide for an agent now, without doing it (read only: it
-- runs under EVAL_RO). The same judge as the claim: pick_task, task_verdict, bucket_of,
-- agent_pause, repo_pause and reservation of _lib.lua.
-- KEYS, ARGV[1]: see _lib.lua.
-- ARGV[2] agent id (' ' for a fresh agent: no history), ARGV[3] mode (strict | best_effort),
-- ARGV[4] how many ready tasks the claim looks at per page (as claim.lua's ARGV[7]),
-- ARGV[5] how many ready tasks (all roles, in claim order) to judge one by one for the
-- answer, ARGV[6..] roles the agent accepts (none: any role).
-- The agent's held task is left out of the pick, as the claim settles it first.
-- Returns {bucket (-1 none), agent pause JSON or '', repository pause JSON or '',
--          reservation JSON or '', held issue or '', next task id or '',
--          JSON list of {id, score, role, why, blocker}} where why is '' (the task `next`
--          names), 'queued' (behind it), 'role', 'bucket', or task_verdict's cause; blocker
--          ('<ref> <state>') with 'blocked'.
local C = context()
if mirror_missing(C) then return redis.error_reply(REBUILDING) end
local agent, mode, scan, shown = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local bucket = bucket_of(C)
local paused = agent_pause(C, agent) or ''
local held_back = repo_pause(C) or ''
local proving = quarantine_until(C, now)
if proving and held_back == '' then
  held_back = cjson.encode({scope = 'quarantine', by = 'broker', at_ms = now,
    reason = 'leases are proven after Redis lost its data, until ' .. proving})
end
local reserved = reservation(C, agent, true)
local held_n = redis.call('GET', C.agent .. agent)
if held_n and redis.call('HGET', C.lease .. held_n, 'agent') ~= agent then held_n = nil end
local skip_id = nil
if held_n then skip_id = redis.call('HGET', C.lease .. held_n, 'task_id') end

local next_id = nil
if reserved then
  next_id = reserved.task_id
elseif paused == '' and held_back == '' then
  local id, score = pick_task(C, sources_of(C, 6), agent, skip_id, '', now, scan, true)
  if id and not (mode == 'strict' and bucket ~= nil
      and math.floor(score / C.priority_unit) > bucket) then
    next_id = id
  end
end

local accepted = nil
if #ARGV >= 6 then
  accepted = {}
  for i = 6, #ARGV do accepted[ARGV[i]] = true end
end
local judged = {}
local items = redis.call('ZRANGE', C.K.ready, 0, shown - 1, 'WITHSCORES')
for i = 1, #items, 2 do
  local id, score = items[i], tonumber(items[i + 1])
  local raw = redis.call('HGET', C.K.tasks, id)
  local role = ''
  if raw then
    local _
    _, role = task_fields(raw)
  end
  local why, blocker = '', nil
  if id ~= next_id then
    why = task_verdict(C, id, agent, skip_id, '', now)
    if why == 'blocked' then
      local ref, state = blocker_of(C, string.match(id, ':(%d+)$'))
      if ref then blocker = ref .. ' ' .. state end
    end
    if why == nil then
      if accepted and not accepted[role] then
        why = 'role'
      elseif mode == 'strict' and bucket ~= nil and math.floor(score / C.priority_unit) > bucket
      then
        why = 'bucket'
      else
        why = 'queued'
      end
    end
  end
  judged[#judged + 1] = {id = id, score = score, role = role, why = why, blocker = blocker}
end
local reserved_json = ''
if reserved then reserved_json = cjson.encode(reserved) end
local judged_json = '[]'
if #judged > 0 then judged_json = cjson.encode(judged) end
return {bucket or -1, paused, held_back, reserved_json, held_n or '', next_id or '', judged_json}
