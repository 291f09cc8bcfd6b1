-- lease_upkeep.lua: what the poller leader (and its webhook worker) learns about a held task:
-- progress GitHub shows, a stall, a budget reached, a stall long enough to revoke.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] action, ARGV[3] issue number, ARGV[4] the lease token
-- the caller judged ('' any: progress from a webhook names no lease), ARGV[5] what (the
-- progress, or the evidence), ARGV[6] the caller's leader epoch:
--   progress   a push to the task's branch, its PR opened or updated, a review reply
--              (ARGV[7] the kind); clears a stall flag
--   stall      flag the lease stalled, once (kept until progress resumes)
--   budget     the wall-clock budget is reached: the task is set aside (set_aside)
--   revoke     a stall outlasted progress.revoke_stalled_after_s: the lease ends (no failure
--              budget spent: a stall is not proof of a broken agent) and the task returns
--   recover    a lease rebuilt from GitHub's labels after a loss, never proven by its agent,
--              whose branch has a PR: the completion Redis lost with its queued label write
--              (ARGV[5] says which PR); it ends completed, as if the agent had said so
--   feedback   a held review missed feedback given before its hand-out: ARGV[5] JSON {ids,
--              comments, note}; added to the review's payload (so it never becomes a fix
--              round) and the note queued for the reviewer's next heartbeat
-- Returns 1 when it changed something, 0 when the lease is not the one judged (ended,
-- re-claimed) or nothing was to do; error FENCED for a deposed leader.
local C = context()
local fenced = fence(C, ARGV[6])
if fenced then return fenced end
local action, n, token, what = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = now_ms()
if redis.call('EXISTS', C.lock .. n) == 0 then return 0 end
local h = redis.call('HMGET', C.lease .. n, 'agent', 'token', 'stalled', 'paused')
if not h[1] or (token ~= '' and h[2] ~= token) then return 0 end
local agent = h[1]

if action == 'progress' then
  record_progress(C, n, ARGV[7], what, now)
  return 1
elseif action == 'stall' then
  -- Set aside by the broker (a budget): it waits for a person, which is no stall.
  if h[3] or h[4] then return 0 end
  redis.call('HSET', C.lease .. n, 'stalled', what)
  timeline(C, 'stalled', n, agent, what)
  audit(C, 'broker', 'stall', n, agent, what, 'flagged stalled; lease kept')
  return 1
elseif action == 'budget' then
  if h[4] then return 0 end
  set_aside(C, n, agent, what, now)
  publish_index(C)
  return 1
elseif action == 'feedback' then
  local late = cjson.decode(what)
  local state_key = C.review_state .. n
  local payload = cjson.decode(redis.call('HGET', state_key, 'payload') or '{}')
  payload.feedback_ids = payload.feedback_ids or {}
  payload.comments = payload.comments or {}
  for _, id in ipairs(late.ids) do payload.feedback_ids[#payload.feedback_ids + 1] = id end
  for _, c in ipairs(late.comments) do payload.comments[#payload.comments + 1] = c end
  redis.call('HSET', state_key, 'payload', cjson.encode(payload))
  local notes = cjson.decode(redis.call('HGET', C.lease .. n, 'notes') or '[]')
  notes[#notes + 1] = {by = 'broker', text = late.note, at_ms = now}
  redis.call('HSET', C.lease .. n, 'notes', cjson.encode(notes))
  timeline(C, 'late_feedback', n, agent, #late.ids .. ' item(s) sent as a note')
  return 1
elseif action == 'recover' then
  if h[2] ~= ADOPTED then return 0 end
  end_lease(C, n, 'completed', now, true, nil, nil, 'completion recovered from ' .. what)
  audit(C, 'broker', 'recover_completion', n, agent, 'Redis lost the completion; ' .. what,
    'completed; in review', nil, 'completed')
  publish_index(C)
  return 1
elseif action == 'revoke' then
  if h[4] then return 0 end
  end_lease(C, n, 'revoked', now, true, nil, nil, 'stalled: ' .. what)
  for _, kind in ipairs({'fix', 'review', 'development'}) do
    if make_ready(C.K.tasks, C.K.ready, C.ready_role, kind .. ':' .. n) then
      redis.call('PUBLISH', C.events, 'ready')
    end
  end
  audit(C, 'broker', 'stall_revoke', n, agent, what, 'lease revoked; task back in the pool', nil,
    'cancelled')
  publish_index(C)
  return 1
end
return redis.error_reply('ERR unknown lease_upkeep action ' .. action)
