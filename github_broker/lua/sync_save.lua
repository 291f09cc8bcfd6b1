-- sync_save.lua: save sync cursors and full-pass page data; mark the mirror rebuilt.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] JSON object of cursor fields (the sync hash),
-- ARGV[3] JSON object of page fields (sync:pages), ARGV[4] JSON list of page fields to drop,
-- ARGV[5] the full_started cursor of a complete pass that just finished ('' none): the
-- mirror key is set only if that cursor is still there, i.e. Redis did not lose its data
-- while the pass ran (the pages read before the loss are gone). ARGV[6] the
-- caller's leader epoch: a deposed leader's cursor must not move the new leader's.
-- ARGV[7] the post-loss hold-back (ms; 0 none: leases cannot be proven, unsigned tokens),
-- ARGV[8] '1' when the caller saw this mirror complete before (so it was lost).
-- When the pass rebuilds a lost mirror, in the same step: `labels_read_ms` (when the pass
-- began reading GitHub's labels; see adopt_proven) and, when the mirror was known before or
-- the rebuild adopted leases from labels (the issues show work in progress: not a first
-- start), the hold-back: no new hand-outs until agents had a heartbeat interval to prove
-- their leases (quarantine_until). Nothing is handed out between the two.
-- Returns the hold-back set (ms, 0 none); error FENCED for a deposed leader.
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
local held_back = 0
if ARGV[5] ~= '' and redis.call('HGET', C.sync, 'full_started') == ARGV[5] then
  local now = now_ms()
  if mirror_missing(C) then
    local read_ms = tonumber(string.match(ARGV[5], '^(%d+)'))
    if read_ms then redis.call('HSET', C.sync, 'labels_read_ms', arg(read_ms)) end
    local hold_ms = tonumber(ARGV[7]) or 0
    if hold_ms > 0 and (ARGV[8] == '1' or redis.call('ZCARD', C.K.leases) > 0) then
      redis.call('SET', C.quarantine, arg(now + hold_ms), 'PX', arg(hold_ms))
      held_back = hold_ms
    end
  end
  redis.call('SET', C.mirror, now)
  publish_index(C)
end
return held_back
