-- agent_record.lua: the deployment's record of paused agents (`{prefix}:agents`), set and
-- lifted under the same rule as each repository's copy (control.lua): a decision is lifted,
-- or replaced by a milder one, only by the same or a higher authority (`lift_refusal`).
-- KEYS[1] the record (a hash: agent -> JSON {kind, by, rank, scope, what, reason, at_ms}).
-- ARGV[1] 'set' or 'lift', ARGV[2] agent, ARGV[3] actor ('<rank>:<name>'), ARGV[4] scope
-- ('deployment'), then for 'set': ARGV[5] kind ('pause' | 'stop'), ARGV[6] reason; last: now
-- (ms).
-- Returns '' when done, else the refusal in words.
local op, agent, scope = ARGV[1], ARGV[2], ARGV[4]
local rank, name = parse_actor(ARGV[3])
local raw = redis.call('HGET', KEYS[1], agent)
local cur = raw and cjson.decode(raw) or nil
if op == 'lift' then
  if not cur then return '' end
  local refused = lift_refusal(cur, rank, scope)
  if refused then return refused end
  redis.call('HDEL', KEYS[1], agent)
  return ''
end
-- A stop replaces a pause of the same or a lower rank; nothing replaces a higher one.
if cur and (tonumber(cur.rank) or 4) > rank then
  return lift_refusal(cur, rank, scope)
end
local kind = ARGV[5]
local verb = kind == 'stop' and 'stopped' or 'paused'
redis.call('HSET', KEYS[1], agent, cjson.encode({kind = kind, by = name, rank = rank,
  scope = scope, what = verb, reason = ARGV[6], at_ms = tonumber(ARGV[#ARGV])}))
return ''
