-- webhook_enqueue.lua: queue one verified GitHub delivery unless its id or its body was seen.
-- KEYS[1] webhook_delivery:{id}, KEYS[2] webhooks (the queue), KEYS[3] webhooks:seen_ms,
-- KEYS[4] webhook_body:{sha256 of the signed body}.
-- ARGV[1] the delivery (JSON envelope), ARGV[2] how long the id and the body are remembered (s).
-- The checks and the push are one step: a delivery is either queued once or not at all.
-- The signature covers the body, not X-GitHub-Delivery: the same signed body under a fresh
-- id is a replay (GitHub's own redeliveries keep the id; a new event has a new body), and it
-- proves nothing about GitHub, so it does not touch webhooks:seen_ms. Every other verified
-- delivery, a redelivery included, proves the webhook alive.
-- Returns 1 when queued, 0 for a delivery id already handled, 2 for a replayed body.
if redis.call('EXISTS', KEYS[4]) == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  return 2
end
local t = redis.call('TIME')
redis.call('SET', KEYS[3], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[4], '1', 'EX', ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
