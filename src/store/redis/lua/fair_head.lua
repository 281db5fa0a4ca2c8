-- fair_head.lua: stores the latest signed head of a queue's public
-- admission log.
-- KEYS[1] the log's HASH (see fair_append.lua)
-- ARGV[1] the head's size  ARGV[2] the signed head (compact JWS)
-- Returns 1 when stored, 0 when the stored head is of a larger size.
-- Why atomic: every instance signs heads; comparing and setting in one
-- step keeps the published head from ever going back to a smaller tree.
-- Cost: one HGET and one HSET, every few seconds per queue.
local stored = tonumber(redis.call('HGET', KEYS[1], 'headSize') or '-1')
if stored > tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'headSize', ARGV[1], 'head', ARGV[2])
return 1
