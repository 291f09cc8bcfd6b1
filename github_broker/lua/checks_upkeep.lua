-- checks_upkeep.lua: what the leader learns of a tracked PR's CI and mergeability
-- (leader/checks.py) and does about it beside offering fix tasks (task_put.lua).
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] action, ARGV[3] issue number:
--   withdraw  ARGV[4] the PR's new head sha: a fix or rebase task made for an older head
--             and not taken yet is moot; it leaves the pool, its round is given back, and a
--             reviewed issue waits on a person again (awaiting_feedback)
--   wait      ARGV[4] code (checks_failed | checks_stale | checks_approval), ARGV[5] detail:
--             the issue waits on a person (timeline `wait_<code>`); never over a
--             maintainer's hold, a budget or needs-human
--   unwait    ARGV[4] codes (comma-separated) whose wait ends now; also ends an
--             awaiting_feedback wait of an issue not reviewed yet (a fix completed before its
--             review: the review is agent work still to come)
--   note      ARGV[4] text, ARGV[5] what it is about: a note for the agent holding the issue,
--             delivered with its next heartbeat; the same subject is noted once per lease
-- Returns 1 when it changed something, 0 otherwise.
local C = context()
local action, n = ARGV[2], ARGV[3]
local now = now_ms()
-- Waits a checks verdict may replace (the others are a person's or the budget's).
local REPLACEABLE = {awaiting_feedback = true, checks_failed = true, checks_stale = true,
  checks_approval = true}

if action == 'withdraw' then
  local task_id = 'fix:' .. n
  local raw = redis.call('HGET', C.K.tasks, task_id)
  if not raw or redis.call('EXISTS', C.lock .. n) == 1 then return 0 end
  local _, _, pr = task_fields(raw)
  local fix_raw = redis.call('GET', C.fix .. pr)
  if not fix_raw then return 0 end
  local fix = cjson.decode(fix_raw)
  if (fix.source ~= 'checks' and fix.source ~= 'conflict') or fix.head_sha == ARGV[4] then
    return 0
  end
  drop_task(C, task_id)
  fix.status = 'withdrawn'
  redis.call('SET', C.fix .. pr, cjson.encode(fix), 'KEEPTTL')
  local state_key = C.review_state .. n
  if (tonumber(redis.call('HGET', state_key, 'ci_rounds')) or 0) > 0 then
    redis.call('HINCRBY', state_key, 'ci_rounds', -1)
  end
  timeline(C, 'fix_withdrawn', n, '', fix.source .. ' fix for ' .. string.sub(fix.head_sha, 1, 7)
    .. ' withdrawn: the PR moved to ' .. string.sub(ARGV[4], 1, 7))
  if redis.call('HGET', state_key, 'reviewed') == '1'
      and redis.call('HEXISTS', C.K.tasks, 'review:' .. n) == 0 then
    wait_for_person(C, n, 'awaiting_feedback',
      'reviewed; waits for a maintainer to merge the PR or to ask for changes', now)
  end
  publish_index(C)
  return 1
elseif action == 'wait' then
  local code, detail = ARGV[4], ARGV[5]
  local raw = redis.call('HGET', C.waiting, n)
  local was = raw and cjson.decode(raw) or nil
  if was and (not REPLACEABLE[was.code] or (was.code == code and was.detail == detail)) then
    return 0
  end
  wait_for_person(C, n, code, detail, now)
  if not was or was.code ~= code then
    timeline(C, 'wait_' .. code, n, '', detail)
    audit(C, 'broker', code, n, '', detail, 'waits on a person')
  end
  publish_index(C)
  return 1
elseif action == 'unwait' then
  local code = waiting_code(C, n)
  if not code then return 0 end
  local ours = {}
  for c in string.gmatch(ARGV[4], '[^,]+') do ours[c] = true end
  if ours[code] or (code == 'awaiting_feedback'
      and redis.call('HGET', C.review_state .. n, 'reviewed') ~= '1') then
    end_wait(C, n)
    publish_index(C)
    return 1
  end
  return 0
elseif action == 'note' then
  if redis.call('EXISTS', C.lock .. n) == 0 then return 0 end
  local lease_key = C.lease .. n
  local h = redis.call('HMGET', lease_key, 'agent', 'notes', 'checks_note')
  if not h[1] or h[3] == ARGV[5] then return 0 end
  local notes = cjson.decode(h[2] or '[]')
  notes[#notes + 1] = {by = 'broker', text = ARGV[4], at_ms = now}
  redis.call('HSET', lease_key, 'notes', cjson.encode(notes), 'checks_note', ARGV[5])
  timeline(C, 'overlap', n, h[1], ARGV[4])
  return 1
end
return redis.error_reply('ERR unknown checks_upkeep action ' .. action)
