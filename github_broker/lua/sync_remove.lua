-- sync_remove.lua: forget issues that were closed, deleted or turned out to be PRs.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2]: JSON list of issue numbers. ARGV[3]: the caller's
-- leader epoch (error FENCED when it is deposed).
-- A live lease on such an issue is revoked with reason issue_closed.
-- Returns {issues removed, leases revoked}.
local C = context()
local fenced = fence(C, ARGV[3])
if fenced then return fenced end
local numbers = cjson.decode(ARGV[2])
local now = now_ms()
local removed, revoked = 0, 0
for _, num in ipairs(numbers) do
  local n = tostring(num)
  if redis.call('EXISTS', C.lease .. n) == 1 then
    end_lease(C, n, 'issue_closed', now)
    revoked = revoked + 1
  end
  removed = removed + redis.call('DEL', C.issue .. n)
  redis.call('SREM', C.K.open, n)
  redis.call('ZREM', C.K.work, n)
  redis.call('HDEL', C.K.skipped, n)
  redis.call('HDEL', C.orphans, n)
  redis.call('HDEL', C.waiting, n)
  redis.call('HDEL', C.usage, n)
  redis.call('ZREM', C.reservations, n)
  redis.call('HDEL', C.reserved_issues, n)
  redis.call('DEL', C.review .. n, C.review_state .. n)
  redis.call('SREM', C.K.reviewing, n)
  for _, kind in ipairs({'development', 'review', 'fix'}) do drop_task(C, kind .. ':' .. n) end
end
publish_index(C)
return {removed, revoked}
