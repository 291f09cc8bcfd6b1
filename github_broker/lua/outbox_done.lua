-- outbox_done.lua: settle a write job after an attempt.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] job, ARGV[3] the payload that was applied,
-- ARGV[4] retry delay in ms, or -1 when the attempt succeeded, ARGV[5] '1' when the job
-- was attempted and failed (counts toward dropping it), '0' when it is only put back.
-- ARGV[6] the caller's leader epoch: a deposed leader's result is refused (error FENCED).
-- A labels write that succeeded is pruned from the intent: its adds stay only in `on`,
-- its removals leave the record. A wish that changed meanwhile (another v) stays queued
-- when anything is left to do: the newer wish is applied next.
-- Returns 1 when the job left the queue, 0 when it stays.
local C = context()
local fenced = fence(C, ARGV[6])
if fenced then return fenced end
local job, applied, delay = ARGV[2], ARGV[3], tonumber(ARGV[4])
local kind, n = string.match(job, '^(%a+):(%d+)$')
local attempts_key = C.outbox_attempts
local now = now_ms()
redis.call('HDEL', C.outbox_taken, job)
if delay >= 0 then
  if ARGV[5] == '1' then redis.call('HINCRBY', attempts_key, job, 1) end
  redis.call('ZADD', C.K.outbox, 'XX', now + delay, job)
  return 0
end
local changed
if kind == 'labels' then
  local raw = redis.call('HGET', C.K.intent, n)
  if raw then
    local adds, removes, on, v = intent_sets(raw)
    local a_add, a_remove, _, a_v = intent_sets(applied)
    for l, _ in pairs(a_add) do adds[l] = nil end
    for l, _ in pairs(a_remove) do
      if removes[l] then removes[l] = nil; on[l] = nil end
    end
    redis.call('HSET', C.K.intent, n, intent_json(adds, removes, on, v))
    changed = v ~= a_v and not (is_empty(adds) and is_empty(removes))
  end
else
  -- Gone (the lease ended) counts as done; another payload is a newer wish.
  local current = redis.call('HGET', C.K.outbox_data, job)
  changed = current and current ~= applied
end
if changed then
  redis.call('ZADD', C.K.outbox, now, job)
  return 0
end
redis.call('ZREM', C.K.outbox, job)
redis.call('HDEL', attempts_key, job)
if kind == 'branch' then
  redis.call('HDEL', C.K.outbox_data, job)
elseif redis.call('SISMEMBER', C.K.open, n) == 0 then
  -- No sync will ever confirm labels on a closed issue; stop tracking them.
  redis.call('HDEL', C.K.intent, n)
end
return 1
