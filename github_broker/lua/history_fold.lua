-- history_fold.lua: fold a repository's finished history minutes into their hours' hashes and
-- the running totals, each minute once (the leader runs it each minute; store/history.py).
-- The scripts count an event in its minute's hash only and mark the minute unfolded
-- (`_lib.lua` `history_count`); readers add the unfolded minutes to what is folded, so a
-- figure is the same before and after a fold.
-- KEYS[1] unfolded minutes (sorted set minute -> minute), KEYS[2] totals hash, KEYS[3] the
-- timeline stream (all in the repository's slot; the minute and hour hashes too).
-- ARGV[1] minute hash prefix, ARGV[2] hour hash prefix, ARGV[3] an hour hash's TTL (s),
-- ARGV[4] most minutes folded in one call.
-- Returns the number of minutes folded.
--
-- A minute is finished once the timeline's last id is past it: an event's minute is its
-- entry's id and Redis gives a new entry an id above the last one, whatever its clock does,
-- so nothing is counted in a folded minute afterwards. Queue samples (`q:*`, `waiting`) are
-- not folded: the sample writes its hour itself and the totals hold no samples.
local info = redis.pcall('XINFO', 'STREAM', KEYS[3])
if info.err then return 0 end -- no timeline: nothing was counted
local last_id
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then last_id = info[i + 1] end
end
local horizon = math.floor(tonumber(string.match(last_id or '0', '^(%d+)')) / 60000)
local minutes = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. horizon,
                           'LIMIT', 0, ARGV[4])
for _, m in ipairs(minutes) do
  local counts = redis.call('HGETALL', ARGV[1] .. m)
  local hour = ARGV[2] .. string.format('%d', math.floor(tonumber(m) / 60))
  for i = 1, #counts, 2 do
    local field = counts[i]
    if string.sub(field, 1, 2) ~= 'q:' and field ~= 'waiting' then
      redis.call('HINCRBY', hour, field, counts[i + 1])
      redis.call('HINCRBY', KEYS[2], field, counts[i + 1])
    end
  end
  if #counts > 0 then redis.call('EXPIRE', hour, ARGV[3]) end
  redis.call('ZREM', KEYS[1], m)
end
return #minutes
