-- webhook_enqueue.lua: queue one verified GitHub delivery unless its id was seen already.
-- KEYS[1] webhook_delivery:{id}, KEYS[2] webhooks (the queue), KEYS[3] webhooks:seen_ms.
-- ARGV[1] the delivery (JSON envelope), ARGV[2] how long the id is remembered (s).
-- The id check and the push are one step: a delivery is either queued once or not at all.
-- Every verified delivery, duplicate or not, proves the webhook alive (webhooks:seen_ms).
-- Returns 1 when queued, 0 for a delivery already handled.
local t = redis.call('TIME')
redis.call('SET', KEYS[3], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  return 0
end
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
