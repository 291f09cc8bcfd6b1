-- outbox_take.lua: take due GitHub writes, hiding them from other drainers for a while.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] most jobs to take, ARGV[3] hide for (ms),
-- ARGV[4] the caller's leader epoch (see fence in _lib.lua).
-- Returns a flat list {job, payload, attempts, ...}; a labels job's payload is the
-- issue's intent, a branch job's its outbox:data entry. Error FENCED for a deposed leader.
-- Each taken job is noted in outbox:taken with the epoch, so the next leader retakes it at
-- once instead of waiting out the hiding time of a leader that stalled with it in hand.
-- A labels job with nothing left to do leaves the queue without a call; the labels it is
-- about to add are marked `on` first (the write may land even if its answer is lost).
local C = context()
local fenced = fence(C, ARGV[4])
if fenced then return fenced end
local now = now_ms()
local jobs = redis.call('ZRANGEBYSCORE', C.K.outbox, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, job in ipairs(jobs) do
  local kind, n = string.match(job, '^(%a+):(%d+)$')
  local payload
  if kind == 'labels' then
    local raw = redis.call('HGET', C.K.intent, n)
    if raw then
      local adds, removes, on, v = intent_sets(raw)
      if is_empty(adds) and is_empty(removes) then
        raw = nil
      else
        for l, _ in pairs(adds) do on[l] = true end
        raw = intent_json(adds, removes, on, v)
        redis.call('HSET', C.K.intent, n, raw)
      end
    end
    payload = raw
  else
    payload = redis.call('HGET', C.K.outbox_data, job)
  end
  if payload then
    redis.call('ZADD', C.K.outbox, now + tonumber(ARGV[3]), job)
    if (tonumber(ARGV[4]) or 0) > 0 then redis.call('HSET', C.outbox_taken, job, ARGV[4]) end
    out[#out + 1] = job
    out[#out + 1] = payload
    out[#out + 1] = redis.call('HGET', C.outbox_attempts, job) or '0'
  else
    redis.call('ZREM', C.K.outbox, job)
    redis.call('HDEL', C.outbox_attempts, job)
  end
end
return out
