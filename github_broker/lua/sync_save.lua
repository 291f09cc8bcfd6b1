-- sync_save.lua: save sync cursors and full-pass page data; mark the mirror rebuilt.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] JSON object of cursor fields (the sync hash),
-- ARGV[3] JSON object of page fields (sync:pages), ARGV[4] JSON list of page fields to drop,
-- ARGV[5] the full_started cursor of a complete pass that just finished ('' none): the
-- mirror key is set only if that cursor is still there, i.e. Redis did not lose its data
-- while the pass ran (the pages read before the loss are gone). ARGV[6] the
-- caller's leader epoch: a deposed leader's cursor must not move the new leader's.
-- Returns 1; error FENCED for a deposed leader.
local C = context()
local fenced = fence(C, ARGV[6])
if fenced then return fenced end
for _, pair in ipairs({{C.sync, ARGV[2]}, {C.sync_pages, ARGV[3]}}) do
  local values = cjson.decode(pair[2])
  if type(values) == 'table' then
    for k, v in pairs(values) do redis.call('HSET', pair[1], k, v) end
  end
end
local drop = cjson.decode(ARGV[4])
if type(drop) == 'table' then
  for _, k in ipairs(drop) do redis.call('HDEL', C.sync_pages, k) end
end
if ARGV[5] ~= '' and redis.call('HGET', C.sync, 'full_started') == ARGV[5] then
  redis.call('SET', C.mirror, now_ms())
  publish_index(C)
end
return 1
