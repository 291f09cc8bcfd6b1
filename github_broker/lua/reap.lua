-- reap.lua: expire leases whose lock timed out and put their tasks back in the pool; return
-- reassignments nobody claimed to the pool; hand over the circuit breaker's trips.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] most leases to look at, ARGV[3] the caller's leader
-- epoch (a new leader's first sweep raises the fence at once).
-- Returns {due leases examined, JSON list of agents the circuit breaker paused here since the
-- last sweep (the poller pauses them in every repository), JSON list of issues revived since
-- (a convicted agent's charge taken back: the poller indexes their tasks again)}; error
-- FENCED for a deposed leader.
local C = context()
local fenced = fence(C, ARGV[3])
if fenced then return fenced end
local now = now_ms()
local limit = tonumber(ARGV[2])
local examined = reap(C, now, limit)
reap_reservations(C, now, limit)
publish_index(C)
local trips = redis.call('LRANGE', C.trips, 0, -1)
redis.call('DEL', C.trips)
local trips_json = '[]'
if #trips > 0 then trips_json = cjson.encode(trips) end
local revived = redis.call('LRANGE', C.revived, 0, -1)
redis.call('DEL', C.revived)
local revived_json = '[]'
if #revived > 0 then revived_json = cjson.encode(revived) end
return {examined, trips_json, revived_json}
