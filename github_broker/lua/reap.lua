-- reap.lua: expire leases whose lock timed out and put their tasks back in the pool.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] most leases to look at.
-- Returns the number of due leases examined.
local C = context()
return reap(C, now_ms(), tonumber(ARGV[2]))
