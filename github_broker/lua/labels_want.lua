-- labels_want.lua: queue a label change on an issue or pull request.
-- KEYS, ARGV[1]: see _lib.lua. ARGV[2] number, ARGV[3] JSON labels to add,
-- ARGV[4] JSON labels to remove. Returns 1.
local C = context()
want_labels(C.K.intent, C.K.outbox, ARGV[2], cjson.decode(ARGV[3]), cjson.decode(ARGV[4]), now_ms())
return 1
