-- outbox_take.lua: take due GitHub writes, hiding them from other drainers for a while.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] most jobs to take, ARGV[3] hide for (ms),
-- ARGV[4] the caller's leader epoch (see fence in _lib.lua).
-- Returns a flat list {job, payload, attempts, ...}; a labels job's payload is the
-- issue's intent, a branch job's its outbox:data entry. Error FENCED for a deposed leader.
-- Each taken job is noted in outbox:taken with the epoch, so the next leader retakes it at
-- once instead of waiting out the hiding time of a leader that stalled with it in hand.
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
    payload = redis.call('HGET', C.K.intent, n)
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
  end
end
return out
