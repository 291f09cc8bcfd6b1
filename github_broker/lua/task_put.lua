-- task_put.lua: offer a review or fix task built by the poller from a PR's feedback.
-- KEYS, ARGV[1]: see _lib.lua.
-- ARGV[2] task id (review:{n} | fix:{n}), ARGV[3] score, ARGV[4] role, ARGV[5] PR number,
-- ARGV[6] agent that did the development work ('' if unknown), ARGV[7] branch,
-- ARGV[8] payload JSON (review: kept in review_state:{n}; fix: task:fix:{pr}),
-- ARGV[9] TTL of task:fix:{pr} in seconds, ARGV[10] '1' for a fix posted directly by a
-- maintainer (allowed outside a needs-review cycle), ARGV[11] the review_state field that
-- counts this kind of round ('' = fix_rounds; fixes from failing checks and rebases count
-- in ci_rounds).
-- An existing fix task is left alone, and a review is offered only once per needs-review
-- cycle, so the same feedback is never handed out twice. A review that waits in the pool
-- (not leased yet) gets the newer payload: the reviewer sees the feedback gathered by the
-- last upkeep pass before its hand-out, not the feedback of the pass that queued it.
-- An issue that is not work (needs-human, lost its priority or role) gets no task; one that
-- waits on a person after its review gets its fix round (which ends the wait), and one held
-- by a maintainer gets it too but it is not handed out before a retry.
-- A fix round naming feedback already handled (by a completed fix, or in the review's
-- payload) is refused: it comes from a pass that read the review state before that (review
-- upkeep is not fenced; a pass can stall in its GitHub calls), and the next pass, reading
-- the state anew, offers only what is new.
-- Returns 1 when the task was added, 2 when a waiting review's payload was refreshed,
-- 0 when it existed or is not wanted.
local C = context()
local task_id, score, role, pr, author, branch, payload =
  ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local kind, n = string.match(task_id, '^(%a+):(%d+)$')
if ARGV[10] ~= '1' and redis.call('SISMEMBER', C.K.reviewing, n) == 0 then return 0 end
local waits = waiting_code(C, n)
if not redis.call('ZSCORE', C.K.work, n) and redis.call('SISMEMBER', C.K.open, n) == 1
    and (not waits or waits == 'needs_human') then
  return 0
end
local state_key = C.review_state .. n
if redis.call('HEXISTS', C.K.tasks, task_id) == 1 then
  if kind == 'review' and redis.call('EXISTS', C.lock .. n) == 0
      and redis.call('HGET', state_key, 'reviewed') ~= '1'
      and redis.call('HGET', state_key, 'payload') ~= payload then
    redis.call('HSET', state_key, 'payload', payload, 'pr', pr)
    return 2
  end
  return 0
end
if kind == 'review' then
  if redis.call('HGET', state_key, 'reviewed') == '1' then return 0 end
  redis.call('HSET', state_key, 'payload', payload, 'pr', pr)
else
  if ARGV[10] ~= '1' then
    local handled = set_of(cjson.decode(redis.call('HGET', state_key, 'handled') or '[]'))
    local review_raw = redis.call('HGET', state_key, 'payload')
    if review_raw and review_raw ~= '' then
      for _, id in ipairs(cjson.decode(review_raw).feedback_ids or {}) do handled[id] = true end
    end
    for _, id in ipairs(cjson.decode(payload).comment_ids or {}) do
      if handled[id] then return 0 end
    end
  end
  redis.call('SET', C.fix .. pr, payload, 'EX', tonumber(ARGV[9]))
  redis.call('HINCRBY', state_key, (ARGV[11] and ARGV[11] ~= '') and ARGV[11] or 'fix_rounds', 1)
end
local now = now_ms()
redis.call('HSET', C.K.tasks, task_id, task_value(score, role, pr, author, now, branch))
-- New feedback after a review: agents have work on it again, it holds the bucket again.
if waits == 'awaiting_feedback' then end_wait(C, n) end
if redis.call('EXISTS', C.lock .. n) == 0 and not PARKED[waits or ''] then
  make_ready(C.K.tasks, C.K.ready, C.ready_role, task_id)
  redis.call('PUBLISH', C.events, 'ready')
end
publish_index(C)
return 1
