-- reap.lua: expire leases whose lock timed out and put their tasks back in the pool.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] most leases to look at, ARGV[3] the caller's leader
-- epoch (a new leader's first sweep raises the fence at once).
-- Returns the number of due leases examined; error FENCED for a deposed leader.
local C = context()
local fenced = fence(C, ARGV[3])
if fenced then return fenced end
return reap(C, now_ms(), tonumber(ARGV[2]))
